"""gMLP and aMLP layers (Liu et al. 2021, "Pay Attention to MLPs"): `gmlp`/`amlp` in
`attention_config`.

A gMLP layer replaces attention and MLP with one block, with GPT-NeoX's sizes (`ff = 4 h`):

    z = act(input_linear(norm(x)))                  (s, b, 2 ff), no bias
    u, v = z[..., :ff], z[..., ff:]                 the channel halves
    g = W[:s, :s] @ norm(v) + b[:s]                 spatial projection over the sequence, W
                                                    lower-triangular (causal), (seq_length)^2
    g = g + tiny_attention(z)                       aMLP only: one causal head of
                                                    `gmlp_attn_dim`, read from z as GPT-NeoX does
    out = x + output_linear(u * g)                  (s, b, h), no bias

`W` starts at zero and `b` at one, so a new block is a plain MLP (the paper's initialisation).
GPT-NeoX's input and output projections hold biases that its forward discards
(`skip_bias_add` whose bias is never added), so they are built without; a saved layer holds
them as zeros, with GPT-NeoX's names for the spatial projection (`sgu.proj.*`), so GPT-NeoX
loads our files and we load its (`megatron/model/neox_names.py`). Two deliberate
differences from GPT-NeoX's `GMLPBlock`: the block keeps the paper's shortcut `x + ...`
(GPT-NeoX returns the projection alone, leaving a gMLP stack without a residual path), and
tensor parallelism is refused before launch (`megatron/config/checks/gmlp_rpe.py`): GPT-NeoX
splits `z` per rank and normalises and gates each rank's slice, which changes the function with
`model_parallel_size`. Positions come from the spatial projection's row, so `position_ids` are
passed along unused and the key/value cache does not apply (`megatron/inference/kv_cache.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron.config.checks.gmlp_rpe import GMLP_TYPES
from megatron.model.activations import build_activation
from megatron.model.args import ModelArgs
from megatron.model.init_methods import input_init, output_init
from megatron.model.neox_names import accept_neox_names
from megatron.model.norms import build_norm
from megatron.parallel import ColumnParallelLinear, RowParallelLinear

GMLP_FF_MULT = 4
"""GPT-NeoX's `ff_mult`: each channel half of the block is `4 * hidden_size` wide."""


def is_gmlp_layer(args: ModelArgs, layer_index: int) -> bool:
    return args.attention_type(layer_index) in GMLP_TYPES


class TinyAttention(nn.Module):
    """aMLP's single causal head: `proj_ffn(softmax(q k^T / sqrt(d_attn)) v)`, q, k, v from
    `proj_qkv(z)`; `(b, s, 2 ff) -> (b, s, ff)`."""

    def __init__(self, d_attn: int, ff: int):
        super().__init__()
        self.proj_qkv = nn.Linear(2 * ff, 3 * d_attn)
        self.proj_ffn = nn.Linear(d_attn, ff)
        self.scale = d_attn**-0.5

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        # (b, s, 3 d_attn) -> (b, 1, s, d_attn) each: SDPA's layout with the one head
        q, k, v = self.proj_qkv(z).unsqueeze(1).chunk(3, dim=-1)
        # Causal and without dropout, so SDPA's flash kernels compute it without the (b, 1, s, s)
        # scores and probabilities, accumulating the softmax in fp32 (as
        # `attention_softmax_in_fp32` asks).
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.proj_ffn(context.squeeze(1))  # (b, s, d_attn) -> (b, s, ff)


class SpatialGatingUnit(nn.Module):
    """`u * (W_causal @ norm(v) + b [+ tiny_attention(z)])` on `z (b, s, 2 ff)`."""

    def __init__(self, args: ModelArgs, ff: int, d_attn: int | None):
        super().__init__()
        self.norm = build_norm(args, ff)
        n = args.seq_length
        self.spatial_weight = nn.Parameter(torch.zeros(n, n))
        self.spatial_bias = nn.Parameter(torch.ones(n))
        self.attn = TinyAttention(d_attn, ff) if d_attn is not None else None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        u, v = z.chunk(2, dim=-1)
        n = z.shape[1]
        if n > self.spatial_bias.shape[0]:  # shapes are known on the host: no device sync
            raise ValueError(
                f"a gMLP layer mixes at most seq_length {self.spatial_bias.shape[0]} positions "
                f"(its spatial projection's size), got a sequence of {n}"
            )
        # Causal: row i mixes positions <= i only. `tril` needs no (n, n) mask, neither built
        # each forward nor kept for the backward (whose gradient is `tril` of the incoming one).
        weight = self.spatial_weight[:n, :n].tril()
        # (b, s, ff) -> (b, ff, s) @ W^T -> (b, s, ff): gate_i = sum_j W_ij v_j + b_i
        gate = F.linear(self.norm(v).transpose(1, 2), weight, self.spatial_bias[:n])
        gate = gate.transpose(1, 2)
        if self.attn is not None:
            gate = gate + self.attn(z)
        return u * gate


class GMLPTransformerLayer(nn.Module):
    """A gMLP (or aMLP) block in the transformer layers' pipeline interface:
    `(x, position_ids) -> (x + block(x), position_ids)`, x `(s, b, h)`."""

    def __init__(self, args: ModelArgs, layer_index: int, tp_group=None, ep_group=None):
        super().__init__()
        h, ff = args.hidden_size, GMLP_FF_MULT * args.hidden_size
        self.layer_index = layer_index
        self.norm = build_norm(args)
        self.input_linear = ColumnParallelLinear(
            h, 2 * ff, tp_group=tp_group, bias=False, init_method=input_init(args)
        )
        self.activation = build_activation(args.activation)
        if self.activation.gated:
            raise ValueError(f"gMLP layers take a one-input activation, not {args.activation}")
        d_attn = args.gmlp_attn_dim if args.attention_type(layer_index) == "amlp" else None
        self.sgu = SpatialGatingUnit(args, ff, d_attn)
        self.output_linear = RowParallelLinear(
            ff,
            h,
            tp_group=tp_group,
            bias=False,
            input_is_parallel=True,
            init_method=output_init(args),
        )
        accept_neox_names(self, args)
        self._register_state_dict_hook(GMLPTransformerLayer.save_unused_biases)

    def save_unused_biases(self, state_dict, prefix, _metadata) -> None:
        """GPT-NeoX's discarded projection biases, as zeros (module docstring)."""
        for name, linear in (
            ("input_linear", self.input_linear),
            ("output_linear", self.output_linear),
        ):
            rows = linear.weight.shape[0]
            state_dict[f"{prefix}{name}.bias"] = linear.weight.new_zeros(rows)

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]):
        x, position_ids = inputs
        z = self.activation(self.input_linear(self.norm(x)))  # (s, b, 2 ff)
        gated = self.sgu(z.transpose(0, 1)).transpose(0, 1)  # the SGU mixes along s
        return x + self.output_linear(gated), position_ids


def gmlp_parameters(args: ModelArgs, layer_index: int) -> int:
    """Parameters of the gMLP/aMLP layer `layer_index` outside its two norms (over `h` and
    `GMLP_FF_MULT * h`, which `megatron/model/counting.py` counts with the other norms)."""
    h, ff, n = args.hidden_size, GMLP_FF_MULT * args.hidden_size, args.seq_length
    params = h * 2 * ff + ff * h + n * n + n
    if args.attention_type(layer_index) == "amlp":
        d = args.gmlp_attn_dim
        params += (2 * ff + 1) * 3 * d + (d + 1) * ff
    return params
