"""Attention backends: the causal core `softmax(q k^T / sqrt(d) + bias) v` behind one interface.

Every backend is an `nn.Module` called as `backend(q, k, v, bias=None)` with

    q: (s, b, nq, d)   this rank's query heads (Megatron layout)
    k, v: (s, b, nkv, d)   this rank's key/value heads; nq is a multiple of nkv (query head i
        uses key/value head i // (nq / nkv), grouped-query attention)
    bias: None or an additive score bias broadcastable to (b, nq, sq, sk) (ALiBi, T5's) that
        already holds the causal and window mask (the dtype's lowest value where a key is
        blocked, `attention_masks.py`): SDPA takes it as its mask as it is

and returns the context `(s, b, nq, d)`. Attention is causal. Backends, chosen per layer by the
layer's attention type (`attention_config`) and the softmax-fusion keys:

| type     | fusion off                 | fusion on (`scaled_*_softmax_fusion`)              |
| -------- | -------------------------- | -------------------------------------------------- |
| `global` | `GlobalAttention`          | `FusedSoftmaxAttention` (CUDA kernel when built)   |
| `flash`, `sdpa` | `SDPAAttention` (torch `scaled_dot_product_attention`; flash on GPU) |

`GlobalAttention` and `FusedSoftmaxAttention` are the same function as `ReferenceAttention`
(GPT-NeoX's `global`), computed by SDPA wherever SDPA computes exactly that: everywhere but
attention dropout in training, whose random draws (the explicit path's, which the RNG parity
tests replay) SDPA would make differently. There they are `ReferenceAttention`, the second
with the fused softmax kernel. SDPA's kernels accumulate the softmax in fp32 and the layer
scaling cancels in exact arithmetic, so `attention_softmax_in_fp32` and
`apply_query_key_layer_scaling` hold on that path too. The explicit path materialises the
`(b, nq, s, s)` scores and keeps the probabilities for the backward; SDPA's flash kernel (no
mask) keeps neither, its memory-efficient kernel (a bias or a window) only the shared mask.

`attention_softmax_in_fp32` and `apply_query_key_layer_scaling` (scores divided by the layer
number before the fp32 softmax, then multiplied back) apply to the explicit-softmax backends;
SDPA picks its own accumulation precision. A score bias (ALiBi's, T5's) is added as GPT-NeoX
adds it: to the scores already divided by the layer number, so the softmax's multiplication
scales the bias by the layer number too, `softmax(q kᵀ / sqrt(d) + coeff · bias)`; on SDPA
the bias is multiplied by it for the same function. Attention dropout draws from the
tensor-parallel RNG (each rank holds different heads, see `megatron.parallel.random`).

Sliding window (`sliding_window_width` W, GPT-NeoX's definition): query `i` sees key `j` iff
`0 <= i - j <= W` (itself and the W keys before it; Hugging Face's `sliding_window` = W + 1).
SDPA takes it as one additive `(s, s)` mask per forward (`attention_masks.additive_mask`),
the explicit softmax as a bool mask (`blocked_keys`); the fused causal kernel does not take
one, so those layers use the PyTorch softmax. Queries are the last `sq` of the `sk` keys, so
the same mask serves the key/value cache (`megatron/inference/kv_cache.py`).

With a mask and grouped key/value heads, SDPA is given every query head's keys and values
(expanded, O(s) memory): on CUDA only the flash kernel takes `enable_gqa`, and it takes no
mask, so `enable_gqa` with a mask would fall back to the math kernel and its `(b, nq, s, s)`
probabilities.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from megatron.kernels import (
    AttnMaskType,
    FusedScaleMaskSoftmax,
    reference_scaled_masked_softmax,
)
from megatron.model.args import ModelArgs, choose
from megatron.model.attention_masks import additive_mask, blocked_keys
from megatron.parallel import MODEL_PARALLEL_RNG, get_rng_tracker
from megatron.parallel.comm import group_size


def tensor_parallel_dropout_context(tp_group):
    """RNG context for dropout on tensor-parallel activations.

    With tp > 1 the tracked tensor-parallel state is required (seed it with
    `megatron.parallel.model_parallel_seed`); at tp = 1 it is used when seeded, else the
    default generator.
    """
    tracker = get_rng_tracker()
    if group_size(tp_group) > 1 or MODEL_PARALLEL_RNG in tracker.get_states():
        return tracker.fork(MODEL_PARALLEL_RNG)
    return contextlib.nullcontext()


class AttentionBackend(nn.Module):
    """Shared settings: scale, dropout, query-key layer scaling, fp32 softmax."""

    def __init__(self, args: ModelArgs, layer_number: int, tp_group=None):
        super().__init__()
        self.tp_group = tp_group
        self.dropout_p = args.attention_dropout
        # muP divides by the head width (GPT-NeoX's `norm_factor`), times its temperature.
        self.scale = (
            1.0 / (args.head_dim * args.mup_attn_temp)
            if args.use_mup
            else 1.0 / math.sqrt(args.head_dim)
        )
        # Megatron's query-key layer scaling: divide by the layer number before the (fp32)
        # softmax and multiply back inside it; a no-op in exact arithmetic, it keeps fp16
        # scores of deep layers in range.
        self.coeff = float(max(1, layer_number)) if args.apply_query_key_layer_scaling else 1.0
        self.softmax_in_fp32 = args.attention_softmax_in_fp32 or self.coeff != 1.0
        self.window = args.sliding_window_width

    def dropout(self, probs: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.dropout_p > 0):
            return probs
        with tensor_parallel_dropout_context(self.tp_group):
            return F.dropout(probs, self.dropout_p, training=True)

    @staticmethod
    def scores_layout(q, k, v):
        """`(b, nq, sq, d)`, `(b, nq, d, sk)`, `(b, nq, sk, d)` with key/value heads repeated."""
        groups = q.shape[2] // k.shape[2]
        if groups > 1:
            k = k.repeat_interleave(groups, dim=2)  # (s, b, nq, d)
            v = v.repeat_interleave(groups, dim=2)
        return q.permute(1, 2, 0, 3), k.permute(1, 2, 3, 0), v.permute(1, 2, 0, 3)

    def raw_scores(self, q, k):
        """`q k^T * scale / coeff`: `(b, nq, sq, sk)` in the compute dtype."""
        return torch.matmul(q * (self.scale / self.coeff), k)

    def context(self, probs, v):
        out = torch.matmul(self.dropout(probs.to(v.dtype)), v)  # (b, nq, sq, d)
        return out.permute(2, 0, 1, 3)  # (s, b, nq, d)


class ReferenceAttention(AttentionBackend):
    """Explicit scores, causal mask and softmax in PyTorch (`megatron.kernels`' reference)."""

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        if self.window is None:
            return reference_scaled_masked_softmax(
                scores, None, self.coeff, causal=True, softmax_in_fp32=self.softmax_in_fp32
            )
        mask = blocked_keys(scores.shape[-2], scores.shape[-1], self.window, scores.device)
        return reference_scaled_masked_softmax(
            scores, mask, self.coeff, causal=False, softmax_in_fp32=self.softmax_in_fp32
        )

    def forward(self, q, k, v, bias=None):
        q, k, v = self.scores_layout(q, k, v)
        scores = self.raw_scores(q, k)  # (b, nq, sq, sk); the softmax multiplies by coeff
        if bias is not None:  # GPT-NeoX's: on the divided scores, so coeff scales it too
            scores = scores + bias.to(scores.dtype)
        return self.context(self.softmax(scores), v)


class GlobalAttention(ReferenceAttention):
    """`global` attention: SDPA, or the explicit softmax for attention dropout in training
    (see the module docstring)."""

    def forward(self, q, k, v, bias=None):
        if self.training and self.dropout_p > 0:
            return super().forward(q, k, v, bias)
        return scaled_dot_product(self, q, k, v, bias)


class FusedSoftmaxAttention(GlobalAttention):
    """`global` with the softmax-fusion keys: SDPA where `GlobalAttention` takes it; elsewhere
    scale, causal mask and softmax in one CUDA kernel (`FusedScaleMaskSoftmax`), which falls
    back to the PyTorch reference where the kernel does not apply or was not built."""

    def __init__(self, args: ModelArgs, layer_number: int, tp_group=None):
        super().__init__(args, layer_number, tp_group)
        self.fused_softmax = FusedScaleMaskSoftmax(
            AttnMaskType.causal,
            fusion=True,
            softmax_in_fp32=self.softmax_in_fp32,
            scale=self.coeff,
        )

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        if self.window is not None:  # the causal kernel takes no window mask
            return super().softmax(scores)
        return self.fused_softmax(scores)


class SDPAAttention(AttentionBackend):
    """`torch.nn.functional.scaled_dot_product_attention` (flash/memory-efficient kernels)."""

    def forward(self, q, k, v, bias=None):
        return scaled_dot_product(self, q, k, v, bias)


def sdpa_mask(backend: AttentionBackend, q, k, bias) -> torch.Tensor | None:
    """SDPA's additive mask for `(b, n, s, d)` q and k: the (pre-masked) bias, the shared window
    or end-aligned causal mask, or None where `is_causal` says it all (the flash kernel)."""
    if bias is not None:  # the layer scaling multiplies it (GPT-NeoX's order: module docstring)
        return bias.to(q.dtype) * backend.coeff if backend.coeff != 1.0 else bias.to(q.dtype)
    sq, sk = q.shape[-2], k.shape[-2]
    if backend.window is None and sq == sk:
        return None
    return additive_mask(sq, sk, backend.window, q.device, q.dtype)


def every_key_value_head(t: torch.Tensor, groups: int) -> torch.Tensor:
    """`(b, nkv, s, d)` -> `(b, nkv * groups, s, d)`: key/value head `i // groups` for head i."""
    b, nkv, s, d = t.shape
    return t[:, :, None].expand(b, nkv, groups, s, d).reshape(b, nkv * groups, s, d)


def scaled_dot_product(backend: AttentionBackend, q, k, v, bias=None) -> torch.Tensor:
    """The backend's attention by SDPA, in the backends' `(s, b, n, d)` layout."""
    # (s, b, n, d) -> (b, n, s, d)
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    mask = sdpa_mask(backend, q, k, bias)
    groups = q.shape[1] // k.shape[1]
    if mask is not None and groups > 1:  # see the module docstring
        k, v = every_key_value_head(k, groups), every_key_value_head(v, groups)
    dropout_p = backend.dropout_p if backend.training else 0.0
    rng = tensor_parallel_dropout_context(backend.tp_group) if dropout_p else None
    with rng or contextlib.nullcontext():
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=dropout_p,
            is_causal=mask is None,
            scale=backend.scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
    return out.permute(2, 0, 1, 3)  # (s, b, nq, d)


# (attention type, softmax fusion on) -> backend class
ATTENTION_BACKENDS: dict[str, dict[bool, type[AttentionBackend]]] = {
    "global": {False: GlobalAttention, True: FusedSoftmaxAttention},
    "flash": {False: SDPAAttention, True: SDPAAttention},
    "sdpa": {False: SDPAAttention, True: SDPAAttention},
}


def build_attention_backend(args: ModelArgs, layer_index: int, tp_group=None) -> AttentionBackend:
    """The backend of transformer layer `layer_index` (0-based)."""
    kind = args.attention_type(layer_index)
    by_fusion = choose(ATTENTION_BACKENDS, "attention_config type", kind)
    return by_fusion[args.softmax_fusion](args, layer_index + 1, tp_group)
