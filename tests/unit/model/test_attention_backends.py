"""The attention backends agree with each other and with a plain formula.

Reference (explicit masked softmax), fused scale-mask-softmax (on CPU: the kernel package's
PyTorch fallback), torch SDPA and `global` attention without fusion (SDPA where it computes the
same function) give the same context and gradients in fp32, with grouped query heads and with an
ALiBi bias, and in bf16 within bf16's rounding; query-key layer scaling is exact in fp32.
"""

from __future__ import annotations

import math

import pytest
import torch

from megatron.model.attention_backends import (
    FusedSoftmaxAttention,
    GlobalAttention,
    ReferenceAttention,
    SDPAAttention,
    build_attention_backend,
)
from megatron.model.positional import AlibiBias, alibi_slopes
from tests.unit.model.tiny import assert_close, neox_args

S, B, NQ, NKV, D = 6, 2, 4, 2, 8


def naive_attention(q, k, v, bias=None):
    """Loop-free textbook formula in (b, n, s, d), kv heads repeated."""
    groups = q.shape[2] // k.shape[2]
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    future = torch.ones(S, S, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(-1)
    return (probs @ v).permute(2, 0, 1, 3)


def inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(S, B, NQ, D, generator=gen, requires_grad=True)
    k = torch.randn(S, B, NKV, D, generator=gen, requires_grad=True)
    v = torch.randn(S, B, NKV, D, generator=gen, requires_grad=True)
    return q, k, v


def run(fn, bias=None):
    q, k, v = inputs()
    out = fn(q, k, v, bias)
    out.backward(torch.ones_like(out).cumsum(0))
    return out.detach(), [t.grad for t in (q, k, v)]


BACKENDS = [ReferenceAttention, FusedSoftmaxAttention, SDPAAttention, GlobalAttention]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("alibi", [False, True])
def test_backend_matches_textbook_attention(backend, alibi):
    args = neox_args(num_attention_heads=NQ, num_kv_heads=NKV, hidden_size=NQ * D)
    bias = None
    if alibi:
        positions = torch.stack([torch.arange(S), torch.arange(S) % 3])  # per-row positions
        q, k, _ = inputs()
        _, _, bias = AlibiBias(args).encode(q, k, positions)
    expected, expected_grads = run(naive_attention, bias)
    actual, grads = run(backend(args, layer_number=3).eval(), bias)
    assert_close(actual, expected, f"{backend.__name__} output", tol=1e-6)
    for name, g, eg in zip("qkv", grads, expected_grads):
        assert_close(g, eg, f"{backend.__name__} d{name}", tol=1e-6)


def neox_scaled_attention(q, k, v, bias, coeff):
    """GPT-NeoX's `ParallelSelfAttention.attention` with query-key layer scaling: the scores
    divided by `sqrt(d) · coeff`, ALiBi's bias added to them, the softmax of `coeff ×` them."""
    groups = q.shape[2] // k.shape[2]
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) / (math.sqrt(q.shape[-1]) * coeff) + bias
    future = torch.ones(S, S, dtype=torch.bool).triu(1)
    probs = (coeff * scores).masked_fill(future, float("-inf")).softmax(-1)
    return (probs @ v).permute(2, 0, 1, 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_scaling_scales_alibi_as_gpt_neox_does(backend):
    args = neox_args(num_attention_heads=NQ, num_kv_heads=NKV, hidden_size=NQ * D,
                     apply_query_key_layer_scaling=True)  # fmt: skip
    q, k, _ = inputs()
    _, _, bias = AlibiBias(args).encode(q, k, torch.arange(S).expand(B, S))
    expected, _ = run(lambda *t: neox_scaled_attention(*t, coeff=3.0), bias)
    actual, _ = run(backend(args, layer_number=3).eval(), bias)
    assert_close(actual, expected, f"{backend.__name__} with ALiBi and layer scaling", tol=1e-6)


def test_query_key_layer_scaling_is_exact_in_fp32():
    args = neox_args(num_attention_heads=NQ, num_kv_heads=NKV, hidden_size=NQ * D)
    scaled = neox_args(
        num_attention_heads=NQ,
        num_kv_heads=NKV,
        hidden_size=NQ * D,
        apply_query_key_layer_scaling=True,
    )
    plain, _ = run(ReferenceAttention(args, layer_number=7))
    backend = ReferenceAttention(scaled, layer_number=7)
    assert backend.coeff == 7.0 and backend.softmax_in_fp32
    assert_close(run(backend)[0], plain, "layer-scaled attention", tol=1e-6)


def test_backend_choice_follows_attention_type_and_fusion():
    args = neox_args(layer_attention_types=("global", "flash", "sdpa", "global"))
    kinds = [type(build_attention_backend(args, i)) for i in range(4)]
    assert kinds == [GlobalAttention, SDPAAttention, SDPAAttention, GlobalAttention]
    fused = neox_args(softmax_fusion=True)
    assert type(build_attention_backend(fused, 0)) is FusedSoftmaxAttention


@pytest.mark.parametrize("scaled", [False, True])
def test_global_attention_matches_textbook_in_bf16(scaled):
    """bf16 inputs: the textbook formula in fp64 on the same (rounded) inputs, within bf16's
    rounding of the context, with and without Megatron's fp32 softmax and layer scaling."""
    args = neox_args(
        num_attention_heads=NQ,
        num_kv_heads=NKV,
        hidden_size=NQ * D,
        apply_query_key_layer_scaling=scaled,
        attention_softmax_in_fp32=scaled,
    )
    q, k, v = (t.detach().bfloat16() for t in inputs())
    expected = naive_attention(q.double(), k.double(), v.double())
    actual = GlobalAttention(args, layer_number=3).eval()(q, k, v)
    assert actual.dtype == torch.bfloat16
    assert_close(actual.double(), expected, "bf16 global attention", tol=2e-2)


def sdpa_calls(monkeypatch, backend, bias=None):
    """How many times `backend` calls torch's SDPA for one forward."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional,
        "scaled_dot_product_attention",
        lambda *a, **k: calls.append(1) or sdpa(*a, **k),
    )
    backend(*inputs(), bias)
    return len(calls)


@pytest.mark.parametrize("backend", [GlobalAttention, FusedSoftmaxAttention])
def test_global_attention_takes_sdpa_wherever_it_is_the_same_function(monkeypatch, backend):
    """GPT-NeoX's `global` attention, with or without the softmax-fusion keys, runs SDPA's
    fused kernels, with an ALiBi bias and a window too; attention dropout in training keeps
    the explicit softmax (whose draws the RNG parity tests replay)."""
    args = neox_args(num_attention_heads=NQ, num_kv_heads=NKV, hidden_size=NQ * D)
    assert sdpa_calls(monkeypatch, backend(args, 1).eval()) == 1
    q, k, _ = inputs()
    _, _, bias = AlibiBias(args).encode(q, k, torch.arange(S).expand(B, S))
    assert sdpa_calls(monkeypatch, backend(args, 1).eval(), bias) == 1
    windowed = neox_args(
        num_attention_heads=NQ, num_kv_heads=NKV, hidden_size=NQ * D, sliding_window_width=2
    )
    assert sdpa_calls(monkeypatch, backend(windowed, 1).train()) == 1
    dropout = neox_args(
        num_attention_heads=NQ, num_kv_heads=NKV, hidden_size=NQ * D, attention_dropout=0.1
    )
    assert sdpa_calls(monkeypatch, backend(dropout, 1).eval()) == 1
    assert sdpa_calls(monkeypatch, backend(dropout, 1).train()) == 0


def test_alibi_slopes_follow_the_paper():
    assert alibi_slopes(8) == [2.0 ** -(i + 1) for i in range(8)]
    six = alibi_slopes(6)  # 4 from the power of two below, then every other one of 8
    assert six[:4] == alibi_slopes(4) and six[4:] == alibi_slopes(8)[0::2][:2]
