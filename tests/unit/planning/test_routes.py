"""On `meta`, attention and dropout keep what the device's kernels keep, not the math path's.

What a kernel keeps for its backward, written out from its definition: FlashAttention-2 (Dao
2023) keeps q, k, v, its output and one fp32 log-sum-exp per query and head; CUDA's dropout
(`native_dropout`) keeps a one-byte mask; the CPU's flash kernel keeps the same as CUDA's. The
math path would keep the `(b, heads, s, s)` probabilities. On real tensors the calls run as
they always do.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from megatron.planning.routes import DeviceRoutes
from megatron.planning.trace import SavedBytes

B, N, S, D = 2, 4, 256, 64
BF16 = 2


def _qkv(kv_heads=N, device="meta", dtype=torch.bfloat16):
    q = torch.randn(B, N, S, D, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(B, kv_heads, S, D, device=device, dtype=dtype, requires_grad=True)
            for _ in range(2))  # fmt: skip
    return q, k, v


def _saved(device, fn) -> int:
    with DeviceRoutes(device), SavedBytes() as saved:
        fn()
    return saved.bytes


def flash_keeps(kv_heads=N) -> int:
    qkv_out = (2 * B * N * S * D + 2 * B * kv_heads * S * D) * BF16
    lse = B * N * S * 4
    return qkv_out + lse


@pytest.mark.parametrize("kv_heads", [N, 2])  # grouped heads too
def test_cuda_attention_keeps_what_flash_attention_keeps(kv_heads):
    q, k, v = _qkv(kv_heads)
    gqa = kv_heads != N
    saved = _saved("cuda", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                   enable_gqa=gqa))  # fmt: skip
    rng_state = 3 * 8  # the philox seed and offset, uint64
    assert flash_keeps(kv_heads) <= saved <= flash_keeps(kv_heads) + rng_state
    math_path = _saved("cpu", lambda: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, dropout_p=0.1, enable_gqa=gqa))  # fmt: skip
    assert math_path > B * N * S * S * BF16  # the probabilities: what flash does not keep


def test_cuda_attention_with_a_mask_keeps_the_mask_not_the_probabilities():
    q, k, v = _qkv()
    mask = torch.zeros(S, S, device="meta", dtype=torch.bfloat16)
    saved = _saved("cuda", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert flash_keeps() + S * S * BF16 <= saved <= flash_keeps() + S * S * BF16 + 3 * 8


def test_cuda_dropout_keeps_a_one_byte_mask():
    x = torch.randn(1024, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    assert _saved("cuda", lambda: F.dropout(x, 0.1, training=True)) == 1024 * 64 * 1
    assert _saved("cpu", lambda: F.dropout(x, 0.1, training=True)) == 1024 * 64 * BF16


def test_cpu_attention_without_dropout_keeps_no_probabilities():
    q, k, v = _qkv(2)
    saved = _saved("cpu", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                  enable_gqa=True))  # fmt: skip
    assert saved == flash_keeps(2)


def test_real_tensors_pass_through():
    q, k, v = _qkv(device="cpu", dtype=torch.float32)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for device in ("cuda", "cpu"):
        with DeviceRoutes(device):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            dropped = F.dropout(q, 0.5, training=False)
        torch.testing.assert_close(out, expected)
        assert dropped is q
