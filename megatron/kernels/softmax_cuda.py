"""Autograd face of the fused softmax CUDA kernels (`csrc/fused_softmax*`).

`fused_scaled_masked_softmax` has the semantics of
`softmax_reference.reference_scaled_masked_softmax` (always computing in float32) and runs one
kernel forward and one backward. `unsupported_reason` says why a call cannot use the kernels,
so callers pick the reference instead; calling the fused function anyway raises that reason.
"""

from __future__ import annotations

import torch

from megatron.kernels.loader import load_extension

# Must match kSoftmaxMaxColumns in csrc/fused_softmax.h (a GPU test checks the built value).
MAX_COLUMNS = 32768
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Device types the registered ops run on (the tests add "cpu" for the emulated kernels).
KERNEL_DEVICE_TYPES = ("cuda",)


def _mask_reason(scores: torch.Tensor, mask: torch.Tensor) -> str | None:
    b, _, sq, sk = scores.shape
    if mask.dtype != torch.bool:
        return f"the mask has dtype {mask.dtype}; the kernels take a bool mask (True = masked)"
    if mask.device != scores.device:
        return f"the mask is on {mask.device} but the scores are on {scores.device}"
    shape_ok = (
        mask.dim() == 4
        and mask.size(0) in (1, b)
        and mask.size(1) == 1
        and mask.size(2) in (1, sq)
        and mask.size(3) == sk
    )
    if not shape_ok:
        return (
            f"mask shape {tuple(mask.shape)} is not (b or 1, 1, sq or 1, sk) for scores "
            f"{tuple(scores.shape)}"
        )
    return None


def unsupported_reason(scores: torch.Tensor, mask: torch.Tensor | None = None) -> str | None:
    """None when the kernels can compute this softmax, else a sentence saying why not.

    Requires: the extension built, (b, np, sq, sk) CUDA scores in float16, bfloat16 or
    float32, sk <= MAX_COLUMNS, and a bool mask of shape (b or 1, 1, sq or 1, sk) if any.
    """
    if scores.device.type not in KERNEL_DEVICE_TYPES:
        return f"the scores are on {scores.device}, the kernels run on CUDA devices"
    if scores.dtype not in KERNEL_DTYPES:
        return f"the scores have dtype {scores.dtype}; the kernels take {KERNEL_DTYPES}"
    if scores.dim() != 4:
        return f"the scores have shape {tuple(scores.shape)}, not (b, np, sq, sk)"
    if scores.size(-1) > MAX_COLUMNS:
        return f"sk = {scores.size(-1)} exceeds the kernels' limit of {MAX_COLUMNS} keys"
    if mask is not None and (reason := _mask_reason(scores, mask)) is not None:
        return reason
    if load_extension("softmax") is None:
        return "the fused softmax extension is not built"
    return None


class _ScaledMaskedSoftmax(torch.autograd.Function):
    """One kernel forward; the backward needs only the saved output, not the mask."""

    @staticmethod
    def forward(ctx, scores, mask, scale, causal):
        output = torch.empty_like(scores)
        torch.ops.megatron_fused_softmax.forward(scores, mask, scale, causal, output)
        ctx.save_for_backward(output)
        ctx.scale = scale
        ctx.causal = causal
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (output,) = ctx.saved_tensors
        grad_input = torch.empty_like(output)
        torch.ops.megatron_fused_softmax.backward(
            grad_output.contiguous(), output, ctx.scale, ctx.causal, grad_input
        )
        return grad_input, None, None, None


def fused_scaled_masked_softmax(
    scores: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float = 1.0,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """softmax(scale * scores) over (b, np, sq, sk) CUDA scores with the fused kernels.

    `mask` is bool (b or 1, 1, sq or 1, sk), True = masked; `causal` also masks keys j > i.
    Masked positions are 0 and fully masked rows are zeros. Raises ValueError with the reason
    when `unsupported_reason` is not None.
    """
    reason = unsupported_reason(scores, mask)
    if reason is not None:
        raise ValueError(f"fused softmax cannot run: {reason}")
    return _ScaledMaskedSoftmax.apply(scores.contiguous(), mask, float(scale), causal)
