"""Rotary positional embedding for the model: the fused CUDA kernel where it applies, else PyTorch.

Layout and convention are those of `rotary_reference` (GPT-NeoX "rotate_half", Megatron
(seq, batch, heads, head_dim) tensors, cos/sin (seq, 1 or batch, 1, rot_dim) rotating the
first rot_dim dims). The `rope_fusion` config key (`cfg.model.rope_fusion`) is the `fused` argument.

The kernel reads q/k through their strides (views of a fused QKV projection are fine as long
as head_dim is contiguous), computes in float32, writes a new contiguous tensor in x's dtype,
and treats cos/sin as constants: if cos or sin requires grad, the reference is used so that
their gradient is computed.
"""

from __future__ import annotations

import torch

from megatron.kernels.loader import load_extension
from megatron.kernels.rotary_reference import reference_rotary

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Device types the registered ops run on (the tests add "cpu" for the emulated kernel).
KERNEL_DEVICE_TYPES = ("cuda",)


def rotary_unsupported_reason(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> str | None:
    """None when the fused kernel can rotate x with these angles, else a sentence saying why."""
    if x.device.type not in KERNEL_DEVICE_TYPES:
        return f"x is on {x.device}, the kernel runs on CUDA devices"
    if x.dtype not in KERNEL_DTYPES:
        return f"x has dtype {x.dtype}; the kernel takes {KERNEL_DTYPES}"
    if cos.dtype not in (x.dtype, torch.float32) or sin.dtype != cos.dtype:
        return f"cos/sin have dtypes {cos.dtype}/{sin.dtype}; the kernel takes float32 or x's"
    if cos.device != x.device or sin.device != x.device:
        return f"cos/sin are on {cos.device}/{sin.device} but x is on {x.device}"
    if cos.requires_grad or sin.requires_grad:
        return "cos/sin require grad; the kernel treats them as constants"
    if load_extension("rotary") is None:
        return "the fused rotary extension is not built"
    return None


class _FusedRotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        output = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        torch.ops.megatron_fused_rotary.forward(x, cos, sin, output)
        ctx.save_for_backward(cos, sin)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        cos, sin = ctx.saved_tensors
        grad_output = _last_dim_contiguous(grad_output)
        grad_input = torch.empty(grad_output.shape, dtype=grad_output.dtype, device=cos.device)
        torch.ops.megatron_fused_rotary.backward(grad_output, cos, sin, grad_input)
        return grad_input, None, None


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 or x.size(-1) == 1 else x.contiguous()


def _check_shapes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if x.dim() != 4:
        raise ValueError(
            f"rotary embedding: x must be (seq, batch, heads, head_dim), got {tuple(x.shape)}"
        )
    seq, batch, head_dim = x.size(0), x.size(1), x.size(-1)
    rot_dim = cos.size(-1)
    if cos.shape != sin.shape or cos.shape not in ((seq, 1, 1, rot_dim), (seq, batch, 1, rot_dim)):
        raise ValueError(
            f"rotary embedding: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must both be "
            f"(seq, 1, 1, rot_dim) or (seq, batch, 1, rot_dim) with seq = {seq}, batch = "
            f"{batch} (x is {tuple(x.shape)})"
        )
    if rot_dim % 2 or not 0 < rot_dim <= head_dim:
        raise ValueError(
            f"rotary embedding: rot_dim = {rot_dim} must be even and in (0, head_dim = "
            f"{head_dim}]; it is rotary_pct * head_dim"
        )


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, fused: bool = True
) -> torch.Tensor:
    """Rotate the first rot_dim = cos.size(-1) dims of x (seq, batch, heads, head_dim).

    cos/sin are (seq, 1, 1, rot_dim), or (seq, batch, 1, rot_dim) when batch rows have their
    own positions. With `fused`, the CUDA kernel runs when
    `rotary_unsupported_reason` is None; otherwise the PyTorch reference. Returns x's dtype.
    """
    _check_shapes(x, cos, sin)
    if fused and rotary_unsupported_reason(x, cos, sin) is None:
        return _FusedRotary.apply(_last_dim_contiguous(x), cos.contiguous(), sin.contiguous())
    return reference_rotary(x, cos, sin)


def apply_rotary_pos_emb(
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    offset: int = 0,
    *,
    fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of query and key, both (seq, batch, heads, head_dim).

    cos/sin are (seq_total, 1, 1, rot_dim) tables, or (seq_total, batch, 1, rot_dim) for
    per-row positions; rows offset .. offset + seq are used (the offset is the number of
    positions already in a KV cache when generating). rot_dim <
    head_dim leaves the last dims unrotated (rotary_pct < 1). query and key may differ in heads
    (grouped-query attention) but not in seq.
    """
    seq = query.size(0)
    if key.size(0) != seq:
        raise ValueError(
            f"apply_rotary_pos_emb: query {tuple(query.shape)} and key {tuple(key.shape)} "
            "differ in seq (dim 0)"
        )
    if offset < 0 or offset + seq > cos.size(0):
        raise ValueError(
            f"apply_rotary_pos_emb: positions {offset}..{offset + seq} are outside the cos/sin "
            f"table of {cos.size(0)} positions; build the table for at least {offset + seq}"
        )
    cos, sin = cos[offset : offset + seq], sin[offset : offset + seq]
    return apply_rotary(query, cos, sin, fused=fused), apply_rotary(key, cos, sin, fused=fused)
