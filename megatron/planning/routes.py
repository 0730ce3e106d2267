"""The kernels a device runs where the `meta` device would take another path: the plan traces
these.

A traced part runs on `meta`, whose dispatch mostly follows the CPU's where an op picks its
kernel by device. Some choices change what a forward keeps for the backward, so `DeviceRoutes`
(a torch function mode) makes them as the device the plan is for makes them. On CUDA:

- `F.dropout` in training: CUDA runs `native_dropout`, which keeps a `bool` mask; elsewhere
  dropout multiplies by a mask of the input's dtype (two bytes per element in bf16, four in
  fp32).
- `F.scaled_dot_product_attention`: CUDA picks the flash kernel (fp16/bf16, head width up to
  256, no mask; grouped key/value heads included), which keeps q, k, v, the output and one fp32
  log-sum-exp per query and head; else, for a mask or fp32, the memory-efficient kernel, which
  also keeps the mask. The `meta` device would run the math fallback, which keeps the
  `(b, heads, s, s)` probabilities.

On the CPU, `scaled_dot_product_attention` without dropout runs the CPU's flash kernel (any
dtype, a mask or not, grouped heads), which keeps no probabilities either; with dropout, the
math path that `meta` runs too.

With a device other than `meta` in the inputs the calls pass through unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256


def flash_applies(q: torch.Tensor, attn_mask) -> bool:
    """Whether CUDA's flash kernel runs this attention (see the module docstring)."""
    return attn_mask is None and q.dtype in FLASH_DTYPES and q.shape[-1] <= FLASH_MAX_HEAD_DIM


def gpu_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_):
    """The output of the kernel CUDA's `scaled_dot_product_attention` would run."""
    if flash_applies(q, attn_mask):
        return aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale
        )[0]
    groups = q.shape[-3] // k.shape[-3]
    if groups > 1:  # the memory-efficient kernel takes every query head's keys and values
        k, v = (t.repeat_interleave(groups, dim=-3) for t in (k, v))
    if attn_mask is not None:
        attn_mask = attn_mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return aten._scaled_dot_product_efficient_attention(
        q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale
    )[0]


def gpu_dropout(x, p=0.5, training=True, inplace=False):
    """`native_dropout`'s output, as CUDA's `F.dropout` computes it."""
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]


def cpu_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """The output of the kernel the CPU's `scaled_dot_product_attention` would run."""
    if dropout_p:
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            **kw,
        )
    return aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale
    )[0]


ROUTES = {
    "cuda": {F.scaled_dot_product_attention: gpu_attention, F.dropout: gpu_dropout},
    "cpu": {F.scaled_dot_product_attention: cpu_attention},
}


class DeviceRoutes(TorchFunctionMode):
    """Within it, dropout and attention on `meta` tensors take `device`'s kernels (module
    docstring)."""

    def __init__(self, device: str):
        super().__init__()
        self.routes = ROUTES[device]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = self.routes.get(func)
        if route is not None and args and getattr(args[0], "is_meta", False):
            return route(*args, **kwargs)
        return func(*args, **kwargs)
