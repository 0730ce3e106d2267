"""Tiny models, batches and the single-process reference shared by the model tests."""

from __future__ import annotations

import dataclasses

import torch

from megatron.model import ModelArgs, build_gpt, full_state_dict

SEQ, MICRO_BATCH = 16, 2


def neox_args(**overrides) -> ModelArgs:
    """A Pythia-shaped toy: layernorm, parallel residual, partial rotary, gelu, biases."""
    values = dict(
        num_layers=4,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=128,
        seq_length=SEQ,
        pos_emb="rotary",
        rotary_pct=0.5,
        gpt_j_residual=True,
        norm="layernorm",
        activation="gelu",
        seed=11,
    )
    values.update(overrides)
    return ModelArgs(**values)


def llama_args(**overrides) -> ModelArgs:
    """A Llama-shaped toy: rmsnorm, swiglu, full rotary, no biases, GQA, untied head."""
    values = dict(
        num_layers=4,
        hidden_size=32,
        num_attention_heads=4,
        num_kv_heads=2,
        vocab_size=128,
        seq_length=SEQ,
        pos_emb="rotary",
        norm="rmsnorm",
        rms_norm_epsilon=1e-6,
        activation="swiglu",
        intermediate_size=48,
        use_bias_in_norms=False,
        use_bias_in_attn_linear=False,
        use_bias_in_mlp=False,
        no_weight_tying=True,
        seed=13,
    )
    values.update(overrides)
    return ModelArgs(**values)


def micro_batches(args: ModelArgs, count: int, seed: int = 0):
    """`count` pipeline-engine micro-batches `((tokens, position_ids), (labels, loss_mask))`."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        tokens = torch.randint(0, args.vocab_size, (MICRO_BATCH, SEQ + 1), generator=gen)
        positions = torch.arange(SEQ).expand(MICRO_BATCH, SEQ).contiguous()
        mask = (torch.rand(MICRO_BATCH, SEQ, generator=gen) > 0.2).float()
        batches.append(((tokens[:, :-1], positions), (tokens[:, 1:].contiguous(), mask)))
    return batches


def reference_loss_and_grads(args: ModelArgs, batches):
    """Single-process plain model: mean micro-batch loss and full gradients by name."""
    model = build_gpt(dataclasses.replace(args, pipe_parallel_size=0))
    loss = sum(model.loss_fn(model(*inputs), labels) for inputs, labels in batches)
    loss = loss / len(batches)
    loss.backward()
    return loss.item(), full_state_dict(model, grads=True), full_state_dict(model)


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, what: str, tol: float = 1e-5, floor=1e-30
):
    """Max-abs error within `tol` of the max-abs value (relative in the tests' sense), or of
    `floor` where the expected values are smaller (an exact zero still allows rounding)."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = (actual - expected).abs().max().item()
    scale = max(expected.abs().max().item(), floor)
    assert err <= tol * scale, f"{what}: max error {err:.3e} vs max value {scale:.3e}"
