"""The fused QKV projection's output is split so that its gradient is written once.

Splitting `query_key_value`'s output into the query, key and value heads by three slices
made the backward zero-fill three QKV-sized gradients (one per slice) and sum them; one split
writes it once. The heads themselves are checked against GPT-NeoX's per-head `[q | k | v]`
layout in `test_hf_parity.py`; here the split must give the same tensors as the slices of
that layout, and its backward must write no QKV-sized zeros.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.model.attention import ParallelSelfAttention
from tests.unit.model.tiny import neox_args

S, B, HEADS, D = 5, 2, 4, 8


class ZeroFills(TorchDispatchMode):
    """Names of the ops that write a zero-filled tensor of at least `numel` elements."""

    ZEROS = {
        "aten.zeros.default",
        "aten.new_zeros.default",
        "aten.fill_.Scalar",
        "aten.zero_.default",
        "aten.slice_backward.default",
        "aten.select_backward.default",
    }

    def __init__(self, numel):
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func) in self.ZEROS and isinstance(out, torch.Tensor) and out.numel() >= self.numel:
            self.ops.append(str(func))
        return out


def test_split_matches_neox_layout_and_writes_the_gradient_once():
    args = neox_args(num_attention_heads=HEADS, hidden_size=HEADS * D)
    attention = ParallelSelfAttention(args, 0)
    qkv = torch.randn(S, B, HEADS * 3 * D, requires_grad=True)
    with ZeroFills(qkv.numel()) as fills:
        q, k, v = attention.split_qkv(qkv)
        (q.sum() + 2 * k.sum() + 3 * v.sum()).backward()
    assert fills.ops == []
    per_head = qkv.detach().view(S, B, HEADS, 3, D)  # GPT-NeoX: [q | k | v] for each head
    for got, index in ((q, 0), (k, 1), (v, 2)):
        assert torch.equal(got, per_head[:, :, :, index])
    expected = torch.tensor([1.0, 2.0, 3.0]).view(1, 1, 1, 3, 1).expand(S, B, HEADS, 3, D)
    assert torch.equal(qkv.grad.view(S, B, HEADS, 3, D), expected)
