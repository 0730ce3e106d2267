"""`FusedScaleMaskSoftmax`: attention probabilities from scores, fused kernel or PyTorch.

The module owns a list of implementations, each a small class with `unsupported_reason` and
`__call__`; a call goes to the first one that supports it. With fusion on, that is the CUDA
kernel when the scores are on a GPU in a supported dtype and shape, and the PyTorch reference
otherwise; both follow the semantics in `softmax_reference` so results agree up to rounding.

Config keys (GPT-NeoX names, `cfg.model`): `scaled_upper_triang_masked_softmax_fusion` turns
the kernel on for causal attention, `scaled_masked_softmax_fusion` for padding (explicit-mask)
attention, `attention_softmax_in_fp32` makes the reference compute in float32.
"""

from __future__ import annotations

import enum
from typing import Any

import torch
from torch import nn

from megatron.kernels.softmax_cuda import fused_scaled_masked_softmax, unsupported_reason
from megatron.kernels.softmax_reference import reference_scaled_masked_softmax


class AttnMaskType(enum.Enum):
    """How attention is masked: `causal` adds the upper-triangular mask, `padding` does not."""

    padding = "padding"
    causal = "causal"


class TorchScaleMaskSoftmax:
    """The pure-PyTorch implementation: runs anywhere, the reference and the fallback."""

    name = "torch"

    def unsupported_reason(self, scores: torch.Tensor, mask: torch.Tensor | None) -> str | None:
        return None

    def __call__(self, scores, mask, *, scale, causal, softmax_in_fp32):
        return reference_scaled_masked_softmax(
            scores, mask, scale, causal=causal, softmax_in_fp32=softmax_in_fp32
        )


class CudaScaleMaskSoftmax:
    """The fused CUDA kernels (always float32 arithmetic inside)."""

    name = "cuda"

    def unsupported_reason(self, scores: torch.Tensor, mask: torch.Tensor | None) -> str | None:
        return unsupported_reason(scores, mask)

    def __call__(self, scores, mask, *, scale, causal, softmax_in_fp32):
        return fused_scaled_masked_softmax(scores, mask, scale, causal=causal)


class FusedScaleMaskSoftmax(nn.Module):
    """softmax(scale * scores) with an optional boolean mask and the causal mask.

    Args:
        mask_type: `AttnMaskType.causal` masks key j > query i (top-left aligned, meant for
            sq == sk; with a KV cache pass an explicit mask and `padding`).
        fusion: use the CUDA kernel where it applies (falls back to PyTorch elsewhere).
        softmax_in_fp32: compute in float32 on the PyTorch path for 16-bit scores (the kernel
            always does).
        scale: multiplies the scores before the softmax; None means 1.

    Call with scores (b, np, sq, sk) and mask None or bool (True = masked) broadcastable to
    the scores; for the kernel, (b or 1, 1, sq or 1, sk). With `causal`, an explicit mask is
    combined with the causal one. Masked positions are 0; fully masked rows are all zeros.
    """

    def __init__(
        self,
        mask_type: AttnMaskType = AttnMaskType.causal,
        fusion: bool = True,
        softmax_in_fp32: bool = True,
        scale: float | None = None,
    ):
        super().__init__()
        if not isinstance(mask_type, AttnMaskType):
            raise ValueError(
                f"FusedScaleMaskSoftmax: mask_type {mask_type!r} is not one of "
                f"{[t.name for t in AttnMaskType]}"
            )
        self.mask_type = mask_type
        self.softmax_in_fp32 = softmax_in_fp32
        self.scale = 1.0 if scale is None else float(scale)
        self.implementations = [CudaScaleMaskSoftmax()] if fusion else []
        self.implementations.append(TorchScaleMaskSoftmax())

    @classmethod
    def from_config(
        cls, cfg: Any, mask_type: AttnMaskType = AttnMaskType.causal, scale: float | None = None
    ) -> FusedScaleMaskSoftmax:
        """Build from a resolved config (reads the fusion and fp32 keys of `cfg.model`)."""
        model = cfg.model
        if mask_type is AttnMaskType.causal:
            fusion = bool(model.scaled_upper_triang_masked_softmax_fusion)
        else:
            fusion = bool(model.scaled_masked_softmax_fusion)
        return cls(mask_type, fusion, bool(model.attention_softmax_in_fp32), scale)

    def select(self, scores: torch.Tensor, mask: torch.Tensor | None = None):
        """The implementation a call with these arguments would use."""
        for implementation in self.implementations:
            if implementation.unsupported_reason(scores, mask) is None:
                return implementation
        raise AssertionError("the PyTorch implementation supports every input")

    def forward(self, scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if scores.dim() != 4:
            raise ValueError(
                f"FusedScaleMaskSoftmax: scores must be (b, np, sq, sk), got shape "
                f"{tuple(scores.shape)}"
            )
        if mask is not None:
            try:
                broadcasts = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape
            except RuntimeError:
                broadcasts = False
            if not broadcasts:
                raise ValueError(
                    f"FusedScaleMaskSoftmax: mask shape {tuple(mask.shape)} does not broadcast "
                    f"to scores shape {tuple(scores.shape)}; use (b or 1, 1, sq or 1, sk)"
                )
            if mask.dtype != torch.bool:
                raise ValueError(
                    f"FusedScaleMaskSoftmax: mask must be bool (True = masked), got {mask.dtype}"
                )
        implementation = self.select(scores, mask)
        return implementation(
            scores,
            mask,
            scale=self.scale,
            causal=self.mask_type is AttnMaskType.causal,
            softmax_in_fp32=self.softmax_in_fp32,
        )

    def extra_repr(self) -> str:
        names = [implementation.name for implementation in self.implementations]
        return f"mask_type={self.mask_type.name}, scale={self.scale}, implementations={names}"
