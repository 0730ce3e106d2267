"""Pure-PyTorch rotary positional embedding: the reference for the CUDA kernel and its fallback.

GPT-NeoX ("rotate_half") convention, Megatron layout:

* x (query or key) is (seq, batch, heads, head_dim);
* cos and sin are (seq, 1, 1, rot_dim) (or (seq, batch, 1, rot_dim) for per-row positions),
  rot_dim = rotary_pct * head_dim, even, usually `cat(freqs, freqs)` so both halves of the
  rotary dims share an angle;
* the first rot_dim dims become `x_rot * cos + rotate_half(x_rot) * sin`, where rotate_half
  splits the rotary dims into halves (x1, x2) and returns (-x2, x1); the remaining
  head_dim - rot_dim dims pass through unchanged (rotary_pct < 1).
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def reference_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rot_dim = cos.size(-1) dims of x (seq, batch, heads, head_dim).

    Arithmetic runs in the promotion of x's and cos's dtypes; the result has x's dtype.
    Differentiable in x (and in cos/sin, which the fused kernel treats as constants).
    """
    rot_dim = cos.size(-1)
    x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    compute = torch.promote_types(x.dtype, cos.dtype)
    x_rot = x_rot.to(compute)
    rotated = x_rot * cos.to(compute) + rotate_half(x_rot) * sin.to(compute)
    return torch.cat((rotated.to(x.dtype), x_pass), dim=-1)
