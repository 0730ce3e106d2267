"""Transformer layers: pre-norm attention and MLP with a sequential or a parallel residual.

Pipeline interface: a layer maps `(hidden, position_ids) -> (hidden, position_ids)`, hidden
`(s, b, h)` (Megatron layout; `(s/tp, b, h)` under sequence parallelism) and position_ids
`(b, s)` int64 carried along for the rotary/ALiBi encodings. The residual style is a class:

- `TransformerLayer` (GPT-2/Llama): `h = x + attn(ln1(x)); out = h + mlp(ln2(h))`
- `ParallelResidualTransformerLayer` (GPT-J/NeoX, `gpt_j_residual`):
  `out = x + attn(ln1(x)) + mlp(ln2(x))`
- `TiedNormParallelResidualTransformerLayer` (`gpt_j_residual` + `gpt_j_tied`): one norm,
  `out = x + attn(ln1(x)) + mlp(ln1(x))`

`hidden_dropout` follows attention and MLP. Their outputs are replicated over tensor-parallel
ranks, so the default generator (identical on a tp group) draws the masks; under sequence
parallelism each rank holds a different chunk and the tensor-parallel RNG is used instead.
The class names contain "TransformerLayer", which `pipe_partition_method: type:transformer`
matches.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model.args import ModelArgs
from megatron.model.attention import ParallelSelfAttention
from megatron.model.attention_backends import tensor_parallel_dropout_context
from megatron.model.moe import build_layer_mlp
from megatron.model.neox_names import accept_neox_names
from megatron.model.norms import build_norm


class TransformerLayer(nn.Module):
    """Pre-norm layer with a sequential residual (attention, then MLP)."""

    def __init__(self, args: ModelArgs, layer_index: int, tp_group=None, ep_group=None):
        super().__init__()
        sp = args.sequence_parallel
        self.layer_index = layer_index
        self.tp_group = tp_group
        self.sequence_parallel = sp
        self.hidden_dropout = args.hidden_dropout
        self.input_layernorm = build_norm(args, sequence_parallel=sp)
        self.attention = ParallelSelfAttention(args, layer_index, tp_group)
        self.post_attention_layernorm = self.build_post_attention_norm(args)
        self.mlp = build_layer_mlp(args, layer_index, tp_group, ep_group)  # dense or experts
        accept_neox_names(self, args)  # a file of GPT-NeoX's current trainer loads too

    def build_post_attention_norm(self, args: ModelArgs) -> nn.Module | None:
        return build_norm(args, sequence_parallel=args.sequence_parallel)

    def dropout(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.hidden_dropout > 0):
            return x
        rng = (
            tensor_parallel_dropout_context(self.tp_group)
            if self.sequence_parallel
            else contextlib.nullcontext()
        )
        with rng:
            return F.dropout(x, self.hidden_dropout, training=True)

    def residual(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        h = x + self.dropout(self.attention(self.input_layernorm(x), position_ids))
        return h + self.dropout(self.mlp(self.post_attention_layernorm(h)))

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]):
        x, position_ids = inputs
        return self.residual(x, position_ids), position_ids


class ParallelResidualTransformerLayer(TransformerLayer):
    """GPT-J/NeoX parallel residual: attention and MLP both read the layer's input."""

    def mlp_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.post_attention_layernorm(x)

    def residual(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        attn = self.dropout(self.attention(self.input_layernorm(x), position_ids))
        return x + attn + self.dropout(self.mlp(self.mlp_input(x)))


class TiedNormParallelResidualTransformerLayer(ParallelResidualTransformerLayer):
    """Parallel residual with a single norm shared by attention and MLP (`gpt_j_tied`)."""

    def build_post_attention_norm(self, args: ModelArgs) -> None:
        return None

    def mlp_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.input_layernorm(x)


# (gpt_j_residual, gpt_j_tied) -> layer class
TRANSFORMER_LAYERS: dict[tuple[bool, bool], type[TransformerLayer]] = {
    (False, False): TransformerLayer,
    (False, True): TransformerLayer,
    (True, False): ParallelResidualTransformerLayer,
    (True, True): TiedNormParallelResidualTransformerLayer,
}


def transformer_layer_class(args: ModelArgs) -> type[TransformerLayer]:
    """The layer class for the configured residual style."""
    return TRANSFORMER_LAYERS[(bool(args.gpt_j_residual), bool(args.gpt_j_tied))]
