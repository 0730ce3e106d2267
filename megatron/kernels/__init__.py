"""Fused CUDA kernels (`csrc/`) and their pure-PyTorch references, which are also the fallback.

What the model calls:

* `FusedScaleMaskSoftmax(mask_type, fusion, softmax_in_fp32, scale)` (or `.from_config(cfg,
  mask_type, scale)`): attention probabilities from (b, np, sq, sk) scores;
* `apply_rotary_pos_emb(query, key, cos, sin, offset=0, fused=...)`: rotary embedding of
  (seq, batch, heads, head_dim) tensors with (seq, 1 or batch, 1, rot_dim) cos/sin tables.

The compiled extensions are optional: without them (or off GPU) the same calls run the
PyTorch reference, and a missing extension is reported once (see `loader`).
"""

from megatron.kernels.fused_softmax import AttnMaskType, FusedScaleMaskSoftmax
from megatron.kernels.loader import extension_status, kernel_available
from megatron.kernels.rotary import apply_rotary, apply_rotary_pos_emb
from megatron.kernels.rotary_reference import reference_rotary, rotate_half
from megatron.kernels.softmax_reference import causal_mask, reference_scaled_masked_softmax

__all__ = [
    "AttnMaskType",
    "FusedScaleMaskSoftmax",
    "apply_rotary",
    "apply_rotary_pos_emb",
    "causal_mask",
    "extension_status",
    "kernel_available",
    "reference_rotary",
    "reference_scaled_masked_softmax",
    "rotate_half",
]
