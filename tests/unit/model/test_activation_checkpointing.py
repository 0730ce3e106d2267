"""Activation checkpointing of the plain model gives exactly the gradients of running without.

With dropout on (hidden and attention), so the test also proves that recomputation replays the
forward's dropout masks (DeepSpeed's checkpoint restores the RNG states). The pipeline module's
checkpointing is tested through DeepSpeed's engine in tests/parallel/test_pipeline_parity.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron.model import build_gpt, full_state_dict
from megatron.parallel import ParallelTopology, model_parallel_seed
from tests.unit.model.tiny import llama_args, micro_batches, neox_args


def loss_and_grads(args, batch, calls):
    model = build_gpt(args).train()
    hooks = [
        m.register_forward_hook(lambda *_: calls.append(1))
        for m in model.modules()
        if type(m).__name__.endswith("TransformerLayer")
    ]
    # Same dropout masks for both runs: the default and the tensor-parallel streams (the
    # latter is process state that earlier tests may have advanced).
    model_parallel_seed(1234, ParallelTopology())
    inputs, labels = batch
    loss = model.loss_fn(model(*inputs), labels)
    loss.backward()
    for hook in hooks:
        hook.remove()
    return loss.detach(), full_state_dict(model, grads=True)


@pytest.mark.parametrize("make_args", [neox_args, llama_args])
@pytest.mark.parametrize("num_layers_per_checkpoint", [1, 3])
def test_checkpointing_gives_identical_gradients(make_args, num_layers_per_checkpoint):
    args = make_args(hidden_dropout=0.2, attention_dropout=0.2)
    (batch,) = micro_batches(args, 1)
    plain_calls, ckpt_calls = [], []
    loss, grads = loss_and_grads(args, batch, plain_calls)
    ckpt = dataclasses.replace(
        args, checkpoint_activations=True, checkpoint_num_layers=num_layers_per_checkpoint
    )
    ckpt_loss, ckpt_grads = loss_and_grads(ckpt, batch, ckpt_calls)
    assert len(ckpt_calls) == 2 * len(plain_calls) == 2 * args.num_layers  # really recomputed
    assert torch.equal(ckpt_loss, loss)
    assert grads.keys() == ckpt_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(ckpt_grads[name], grad), name
