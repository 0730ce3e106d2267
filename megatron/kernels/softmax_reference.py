"""Pure-PyTorch scaled, masked softmax: the reference for the CUDA kernels and their fallback.

Semantics shared with `csrc/fused_softmax*.cu` (tests hold both to them):

* `scores` is (b, np, sq, sk): batch, attention heads, queries, keys. The result is
  `softmax(scale * scores)` over the last dim, returned in the dtype of `scores`.
* An explicit `mask` is boolean, True = masked, broadcastable to (b, np, sq, sk); the kernels
  take (b or 1, 1, sq or 1, sk), i.e. one mask per batch entry shared by all heads.
* `causal` masks key j for query i when j > i (upper triangle, top-left aligned); combined
  with an explicit mask, a position is masked when either masks it.
* Masked positions get probability exactly 0, and a row whose positions are all masked is all
  zeros (not NaN, not uniform); its gradient is zero too.
"""

from __future__ import annotations

import torch


def causal_mask(sq: int, sk: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The (1, 1, sq, sk) boolean mask that is True where key index j > query index i."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(diagonal=1)[None, None]


def combined_mask(
    scores: torch.Tensor, mask: torch.Tensor | None, causal: bool
) -> torch.Tensor | None:
    """The explicit mask OR-ed with the causal mask (when `causal`), or None for no mask."""
    if not causal:
        return mask
    upper = causal_mask(scores.size(-2), scores.size(-1), scores.device)
    return upper if mask is None else upper | mask


def reference_scaled_masked_softmax(
    scores: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float = 1.0,
    *,
    causal: bool = False,
    softmax_in_fp32: bool = True,
) -> torch.Tensor:
    """softmax(scale * scores) with masked positions at 0, in the dtype of `scores`.

    `softmax_in_fp32` computes in float32 for float16/bfloat16 scores (as the kernels always
    do); otherwise the arithmetic runs in the dtype of `scores`. Differentiable.
    """
    x = scores.float() if softmax_in_fp32 else scores
    x = x * scale
    full_mask = combined_mask(scores, mask, causal)
    if full_mask is None:
        return torch.softmax(x, dim=-1).to(scores.dtype)
    # The finite fill keeps fully masked rows free of NaN (they come out uniform and are zeroed
    # by the second fill); elsewhere exp(min - max) underflows to exactly 0, as with -inf.
    x = x.masked_fill(full_mask, torch.finfo(x.dtype).min)
    probs = torch.softmax(x, dim=-1).masked_fill(full_mask, 0.0)
    return probs.to(scores.dtype)


def reference_softmax_backward(
    grad_output: torch.Tensor, softmax_output: torch.Tensor, scale: float = 1.0
) -> torch.Tensor:
    """The input gradient of the scaled softmax given its output y: scale * y * (dy - <dy, y>).

    Masked positions (y = 0) get 0. Computed in the dtype of the arguments; the GPU tests call
    it in float64 to check the kernels' backward on the very same `softmax_output`.
    """
    dot = (grad_output * softmax_output).sum(dim=-1, keepdim=True)
    return scale * softmax_output * (grad_output - dot)
