"""What a GPU would hold at the size of the logits for one training step's forward and
backward through the real loss paths: the language-model loss as the engines call it
(`model.loss_fn(model(tokens, positions), labels)`, with and without the z-loss) and the
DPO/KTO objectives' losses (`megatron/training/objectives/logprobs.py`), in fp32 and bf16.

A 2-layer GPT 64 wide over GPT-NeoX's padded vocabulary (50304 rows, 50277 tokens) runs with
`tests/device_costs.py::LargeTensors` recording each op's outputs and what autograd saves; the
test counts the distinct memory of at least half the logits' elements (a copy of the true
vocabulary's columns, an fp32 upcast, a log-softmax, a gradient would each be one). The tokens
are scaled down to b=2, s=256 (the real vocabulary kept): at s=2048 one bf16 step takes ~90 s
on a loaded 2-core CPU, and the count does not depend on the tokens as long as the cross
entropy runs several chunks (here 26 of 20 rows; `megatron/parallel/cross_entropy.py`).

- The fused head and loss (`loss_chunk_tokens` 64 here, 8 chunks), with and without the
  z-loss, and DPO's and KTO's chunked log-probabilities: none. Each chunk's logits (64 x 50304)
  are below the threshold; nothing of the tokens x vocabulary size is written, in the forward
  or the backward, fp32 or bf16.
- Every other path: the logits alone. The cross entropy consumes them (their memory holds the
  softmax, then the gradient the head's backward reads), the z-loss takes the logsumexp the
  cross entropy computes, and DPO's and KTO's log-probabilities consume them as the
  language-model loss does (`sequence_logps(consume=True)`; before, their backward wrote the
  logits' gradient into a new buffer: 824 MB in fp32 at b=2, s=2048).
  `test_cross_entropy_single.py` counts the same without a model: one buffer unconsumed, none
  consumed.
"""

from __future__ import annotations

import functools

import pytest
import torch

from megatron.model import ModelArgs, build_gpt
from megatron.training.objectives import build_objective
from tests.device_costs import LargeTensors
from tests.tiny import tiny_config

B, S, VOCAB, TOKENS = 2, 256, 50304, 50277
LARGE = B * S * VOCAB // 2  # elements: half the logits
# path -> (train_impl, z_loss, loss_chunk_tokens, logits-sized buffers a step holds)
PATHS = {
    "lm": ("normal", 0.0, 0, 1),
    "lm z_loss": ("normal", 1e-4, 0, 1),
    "lm fused": ("normal", 0.0, 64, 0),
    "lm fused z_loss": ("normal", 1e-4, 64, 0),
    "dpo": ("dpo", 0.0, 0, 1),
    "kto": ("kto", 0.0, 0, 1),
    "dpo fused": ("dpo", 0.0, 64, 0),
    "kto fused": ("kto", 0.0, 64, 0),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def model_args(z_loss: float, loss_chunk_tokens: int = 0) -> ModelArgs:
    return ModelArgs(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=VOCAB,
        true_vocab_size=TOKENS,
        seq_length=S,
        norm="layernorm",
        activation="gelu",
        pos_emb="rotary",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        z_loss=z_loss,
        loss_chunk_tokens=loss_chunk_tokens,
        seed=1,
    )


def loss_inputs(train_impl: str, generator: torch.Generator):
    """The labels the engine hands `model.loss_fn` for the objective (`model_inputs`'s)."""
    labels = torch.randint(0, TOKENS, (B, S), generator=generator)
    mask = (torch.rand(B, S, generator=generator) > 0.1).float()
    if train_impl == "normal":
        return labels, mask
    ref = torch.randn(B, generator=generator)
    if train_impl == "dpo":
        return labels, mask, ref
    reward = torch.tensor([[1.0], [-1.0]]).expand(B, S)  # one desirable, one undesirable
    return labels, mask, ref, reward


@functools.cache  # the buffers hold no tensor, only weak references
def one_step(path: str, dtype_name: str) -> LargeTensors:
    """`LargeTensors` of one forward and backward through the loss path `path`."""
    train_impl, z_loss, chunk, _ = PATHS[path]
    torch.manual_seed(0)
    model = build_gpt(model_args(z_loss, chunk)).to(DTYPES[dtype_name]).train()
    if train_impl != "normal":
        cfg = tiny_config().replace(
            train_impl=train_impl, true_vocab_size=TOKENS, loss_chunk_tokens=chunk
        )
        build_objective(cfg).install(model)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, TOKENS, (B, S), generator=generator)
    positions = torch.arange(S).expand(B, S)
    labels = loss_inputs(train_impl, generator)
    with LargeTensors() as buffers:
        loss = model.loss_fn(model(tokens, positions), labels)
        loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    return buffers


@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("path", sorted(PATHS))
def test_logits_sized_buffers_per_loss_path(path, dtype_name):
    buffers = one_step(path, dtype_name)
    large = [b for b in buffers.buffers if torch.Size(b.shape).numel() >= LARGE]
    assert len({b.storage for b in large}) == PATHS[path][3], buffers.report(large)
    if large:
        assert {b.dtype for b in large} == {DTYPES[dtype_name]}, buffers.report(large)
