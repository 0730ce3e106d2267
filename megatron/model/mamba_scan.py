"""Mamba's selective scan and causal convolution: a pure-PyTorch reference that runs anywhere,
and the `mamba-ssm` / `causal-conv1d` CUDA kernels where they are installed.

The selective scan (Gu & Dao 2023, Algorithm 2), for input `u` and gate `z` `(b, d, l)`, step
sizes `delta` `(b, d, l)` with bias `delta_bias` `(d,)`, `A` `(d, n)`, input-dependent `B`, `C`
`(b, n, l)` and skip `D` `(d,)`; with `dt = softplus(delta + delta_bias)`:

    x_t = exp(dt_t A) * x_{t-1} + dt_t B_t u_t          (state `(b, d, n)`, x_0 = 0)
    y_t = (x_t . C_t) + D u_t
    out_t = y_t * silu(z_t)

The reference runs the recurrence step by step in fp32 and returns the input's dtype, as
`mamba_ssm`'s `selective_scan_ref` does; the kernels compute the same function (they are used
only on CUDA tensors, when the config's `mamba_*_fusion` switch asks for them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def selective_scan_reference(u, delta, A, B, C, D, z, delta_bias):
    """`out` `(b, d, l)` of the recurrence in the module docstring (fp32 inside)."""
    dtype = u.dtype
    u, z = u.float(), z.float()
    dt = F.softplus(delta.float() + delta_bias.float()[:, None])  # (b, d, l)
    decay = torch.exp(dt.unsqueeze(-1) * A.float()[:, None])  # (b, d, l, n)
    drive = (dt * u).unsqueeze(-1) * B.float().transpose(1, 2).unsqueeze(1)  # (b, d, l, n)
    readout = C.float().transpose(1, 2)  # (b, l, n)
    state = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])  # (b, d, n)
    ys = []
    for t in range(u.shape[-1]):
        state = decay[:, :, t] * state + drive[:, :, t]
        ys.append(torch.einsum("bdn,bn->bd", state, readout[:, t]))
    y = torch.stack(ys, dim=-1) + u * D.float()[:, None]  # (b, d, l)
    return (y * F.silu(z)).to(dtype)


def causal_conv_reference(x, weight, bias):
    """Depthwise causal convolution of `x` `(b, d, l)` with `weight` `(d, 1, w)`, then SiLU."""
    width = weight.shape[-1]
    out = F.conv1d(x, weight, bias, padding=width - 1, groups=x.shape[1])
    return F.silu(out[..., : x.shape[-1]])


def selective_scan(u, delta, A, B, C, D, z, delta_bias, fused: bool):
    """The scan by `mamba_ssm`'s kernel when `fused` and on CUDA, else the reference."""
    if fused and u.is_cuda:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn

        return selective_scan_fn(
            u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=True
        )
    return selective_scan_reference(u, delta, A, B, C, D, z, delta_bias)


def causal_conv(x, weight, bias, fused: bool):
    """The convolution by `causal_conv1d`'s kernel when `fused` and on CUDA, else the
    reference."""
    if fused and x.is_cuda:
        from causal_conv1d import causal_conv1d_fn

        return causal_conv1d_fn(x, weight.squeeze(1), bias, activation="silu")
    return causal_conv_reference(x, weight, bias)
