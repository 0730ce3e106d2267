"""Mamba layers (`mamba` in `attention_config`): GPT-NeoX's pre-norm selective-state-space block.

A `mamba` layer replaces a whole transformer layer (no attention, no MLP):
`out = x + mixer(norm(x))`. The mixer (Gu & Dao 2023, Algorithm 2; GPT-NeoX's sizes) with
`d_inner = intermediate_size` (default 2 × hidden), `d_state = 16`, a convolution 4 wide and
`dt_rank = ceil(hidden / 16)`:

    x, z = in_proj(h)                          (d_inner each)
    x = silu(causal_depthwise_conv(x))
    dt, B, C = x_proj(x)                       (dt_rank, d_state, d_state)
    y = selective_scan(x, dt_proj.weight @ dt, A = -exp(A_log), B, C, D, z, dt_proj.bias)
    out = out_proj(y)

`mamba_use_bias_in_linears` biases in_proj, x_proj and out_proj; `mamba_use_bias_in_conv` the
convolution; dt_proj always has its bias (the step-size parameter of Algorithm 2). A_log and
D take no weight decay. Mamba layers have no dropout (GPT-NeoX's have none either).

With `mamba_selective_fp32_params` (GPT-NeoX's default) A_log and D are marked `keep_fp32`:
in an fp16/bf16 run they, their gradients and their optimizer state stay fp32
(`megatron/training/step/fp32_params.py`), while every other weight, dt_proj's bias included
(as in GPT-NeoX), is cast to the run's dtype. The scan reads all three in fp32 and returns the
input's dtype, so out_proj gets the half-precision activations it computes in.

Tensor parallelism is refused for Mamba (`megatron/config/checks/validate.py`), so the
parameters are ordinary replicated ones. Initialisation follows GPT-NeoX: `init_method` for
in_proj and x_proj, `output_layer_init_method` for out_proj, S4D-real `A`, `D = 1`, and
dt_proj's weight uniform in ±dt_rank^-1/2 with its bias the inverse softplus of step sizes
log-uniform in [0.001, 0.1] (floored at 1e-4).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from megatron.model.args import ModelArgs
from megatron.model.init_methods import input_init, output_init
from megatron.model.mamba_scan import causal_conv, selective_scan
from megatron.model.norms import build_norm
from megatron.model.param_groups import keep_fp32

D_STATE = 16
D_CONV = 4
DT_MIN, DT_MAX, DT_FLOOR = 0.001, 0.1, 1.0e-4


def mamba_inner_size(args: ModelArgs) -> int:
    """`d_inner`: `intermediate_size`, else GPT-NeoX's default expansion 2 × hidden."""
    return args.intermediate_size or 2 * args.hidden_size


def mamba_dt_rank(args: ModelArgs) -> int:
    return math.ceil(args.hidden_size / 16)


def _linear(n_in: int, n_out: int, bias: bool, init) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=bias)
    init(layer.weight)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


class MambaMixer(nn.Module):
    """The selective-state-space mixer on `(s, b, h)` hidden states (module docstring)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        h, d = args.hidden_size, mamba_inner_size(args)
        self.dt_rank = r = mamba_dt_rank(args)
        bias = args.mamba_use_bias_in_linears
        self.fuse_scan = args.mamba_selective_scan_fusion
        self.fuse_conv = args.mamba_causal_conv_fusion
        self.fuse_inner = args.mamba_inner_func_fusion
        self.in_proj = _linear(h, 2 * d, bias, input_init(args))
        self.conv1d = nn.Conv1d(
            d, d, D_CONV, groups=d, padding=D_CONV - 1, bias=args.mamba_use_bias_in_conv
        )
        self.x_proj = _linear(d, r + 2 * D_STATE, bias, input_init(args))
        self.dt_proj = nn.Linear(r, d, bias=True)
        self.out_proj = _linear(d, h, bias, output_init(args))
        with torch.no_grad():
            nn.init.uniform_(self.dt_proj.weight, -(r**-0.5), r**-0.5)
            log_dt = torch.rand(d) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)
            dt = torch.exp(log_dt).clamp(min=DT_FLOOR)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        a = torch.arange(1, D_STATE + 1, dtype=torch.float32).repeat(d, 1)  # (d, n)
        self.A_log = nn.Parameter(torch.log(a))
        self.D = nn.Parameter(torch.ones(d))
        self.A_log.no_weight_decay = True
        self.D.no_weight_decay = True
        if args.mamba_selective_fp32_params:  # GPT-NeoX's `_deepspeed_no_cast`
            keep_fp32(self.A_log)
            keep_fp32(self.D)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        xz = self.in_proj(hidden).permute(1, 2, 0)  # (b, 2d, s)
        A = -torch.exp(self.A_log.float())  # (d, n)
        if self.fuse_inner and xz.is_cuda:
            return self._fused_inner(xz, A).transpose(0, 1)
        x, z = xz.chunk(2, dim=1)
        x = causal_conv(x, self.conv1d.weight, self.conv1d.bias, self.fuse_conv)
        dt, B, C = self.x_proj(x.transpose(1, 2)).split([self.dt_rank, D_STATE, D_STATE], -1)
        delta = (dt @ self.dt_proj.weight.t()).transpose(1, 2)  # (b, d, s), bias in the scan
        y = selective_scan(
            x,
            delta,
            A,
            B.transpose(1, 2).contiguous(),  # (b, n, s)
            C.transpose(1, 2).contiguous(),
            self.D.float(),
            z,
            self.dt_proj.bias.float(),
            self.fuse_scan,
        )
        out = self.out_proj(y.transpose(1, 2))  # (b, s, h)
        return out.transpose(0, 1)

    def _fused_inner(self, xz: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
        """The whole mixer after in_proj by `mamba_ssm`'s `mamba_inner_fn` -> `(b, s, h)`."""
        from mamba_ssm.ops.selective_scan_interface import mamba_inner_fn

        return mamba_inner_fn(
            xz,
            self.conv1d.weight,
            self.conv1d.bias,
            self.x_proj.weight,
            self.dt_proj.weight,
            self.out_proj.weight,
            self.out_proj.bias,
            A,
            None,  # B and C come from x_proj
            None,
            self.D.float(),
            delta_bias=self.dt_proj.bias.float(),
            delta_softplus=True,
        )


class MambaTransformerLayer(nn.Module):
    """Pre-norm Mamba residual layer, `(hidden, position_ids) -> (hidden, position_ids)`.

    Its class name contains "TransformerLayer" because it takes a transformer layer's place:
    `pipe_partition_method: type:transformer` and activation checkpointing count it as one.
    """

    def __init__(self, args: ModelArgs, layer_index: int, tp_group=None, ep_group=None):
        super().__init__()
        self.layer_index = layer_index
        self.norm = build_norm(args, sequence_parallel=False)
        self.mixer = MambaMixer(args)

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]):
        x, position_ids = inputs
        return x + self.mixer(self.norm(x)), position_ids
