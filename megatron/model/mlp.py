"""The tensor-parallel MLP: column-parallel up projection(s), activation, row-parallel down.

`ParallelMLP` (plain activations) and `ParallelGatedMLP` (GLU variants) share the layout
`(s, b, h) -> (s, b, ffn/tp) -> (s, b, h)`: each rank holds `ffn/tp` inner units, so the only
communication is the row-parallel layer's all-reduce (or reduce-scatter under sequence
parallelism). The class is chosen by the activation's `gated` flag.

Inner size (`mlp_inner_size`), as GPT-NeoX computes it so its config files build the same
model: start from `intermediate_size` (default `4 * hidden`); a gated activation takes 2/3 of
that for its two input projections together, so each branch is `int(2/3 * size) // 2` wide;
the width is rounded up to a multiple of `mlp_multiple_of`. GPT-NeoX's Llama-7B config
(`intermediate_size: 32768`, `mlp_multiple_of: 256`) thus gives Llama's 11008, which is also
the Hugging Face `intermediate_size` of the converted model.
"""

from __future__ import annotations

import torch
from torch import nn

from megatron.config.groups.model import mlp_size
from megatron.model.activations import build_activation
from megatron.model.args import ModelArgs
from megatron.model.init_methods import input_init, output_init
from megatron.parallel import ColumnParallelLinear, RowParallelLinear


def mlp_inner_size(args: ModelArgs) -> int:
    """The MLP's inner width per branch (see the module docstring)."""
    ffn = mlp_size(args.intermediate_size, args.hidden_size)
    if build_activation(args.activation).gated:
        ffn = int(2 * ffn / 3) // 2
    multiple = max(1, args.mlp_multiple_of)
    return multiple * ((ffn + multiple - 1) // multiple)


class ParallelMLP(nn.Module):
    """`dense_4h_to_h(act(dense_h_to_4h(x)))`."""

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__()
        ffn, sp = mlp_inner_size(args), args.sequence_parallel
        self.activation = build_activation(args.activation)
        self.dense_h_to_4h = ColumnParallelLinear(
            args.hidden_size,
            ffn,
            tp_group=tp_group,
            bias=args.use_bias_in_mlp,
            init_method=input_init(args),
            sequence_parallel=sp,
        )
        self.dense_4h_to_h = RowParallelLinear(
            ffn,
            args.hidden_size,
            tp_group=tp_group,
            bias=args.use_bias_in_mlp,
            input_is_parallel=True,
            init_method=output_init(args),
            sequence_parallel=sp,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = self.activation(self.dense_h_to_4h(x))  # (s, b, ffn/tp)
        return self.dense_4h_to_h(inner)  # (s, b, h), or (s/tp, b, h) under SP


class ParallelGatedMLP(nn.Module):
    """`dense_4h_to_h(act(dense_h_to_4h_gate(x)) * dense_h_to_4h(x))` (SwiGLU and kin).

    Gate and value are separate column-parallel weights, so each rank's shard of one matches
    its shard of the other at any tp (a single fused `(2 ffn, h)` weight would not).
    """

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__()
        ffn, sp = mlp_inner_size(args), args.sequence_parallel

        def column():
            return ColumnParallelLinear(
                args.hidden_size,
                ffn,
                tp_group=tp_group,
                bias=args.use_bias_in_mlp,
                init_method=input_init(args),
                sequence_parallel=sp,
            )

        self.activation = build_activation(args.activation)
        self.dense_h_to_4h = column()
        self.dense_h_to_4h_gate = column()
        self.dense_4h_to_h = RowParallelLinear(
            ffn,
            args.hidden_size,
            tp_group=tp_group,
            bias=args.use_bias_in_mlp,
            input_is_parallel=True,
            init_method=output_init(args),
            sequence_parallel=sp,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (s, b, ffn/tp) each; under SP both column layers gather the sequence themselves.
        inner = self.activation(self.dense_h_to_4h_gate(x), self.dense_h_to_4h(x))
        return self.dense_4h_to_h(inner)


def build_mlp(args: ModelArgs, tp_group=None) -> nn.Module:
    """The MLP class matching the activation (gated or not)."""
    cls = ParallelGatedMLP if build_activation(args.activation).gated else ParallelMLP
    return cls(args, tp_group)
