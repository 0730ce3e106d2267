"""Tensor-parallel layers: column- and row-parallel linear, vocab-parallel embedding.

Weights keep `nn.Linear`'s layout `(out_features, in_features)` and are really sharded: a
column-parallel weight is `(out/tp, in)` (split dim 0), a row-parallel weight `(out, in/tp)`
(split dim 1), a vocab-parallel embedding `(vocab/tp, dim)` (split dim 0). `init_method(t)` is
applied to the FULL weight on every rank and each rank keeps its slice, so a seed gives the same
full model at any tp. Biases start at zero.

A Megatron MLP/attention block is `ColumnParallelLinear -> local op -> RowParallelLinear`: one
all-reduce forward and one backward. With `sequence_parallel=True`, activations outside the
block are sharded along the sequence, `(s/tp, b, h)`: the column layer all-gathers the sequence
on entry and the row layer reduce-scatters it on exit (same traffic as the all-reduce, but the
norms and dropouts between blocks work on 1/tp of the tokens).

`tp_group=None` means no tensor parallelism: the layers then equal `nn.Linear`/`nn.Embedding`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from megatron.parallel.comm import divide, group_rank, group_size
from megatron.parallel.mappings import (
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)
from megatron.parallel.params import (
    InitMethod,
    mark_sequence_parallel,
    set_tensor_model_parallel_attributes,
    sharded_parameter,
)


def linear_default_init(weight: torch.Tensor) -> None:
    """`nn.Linear`'s default weight init (Kaiming-uniform, a=sqrt(5)) on the full weight."""
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))


def embedding_default_init(weight: torch.Tensor) -> None:
    """`nn.Embedding`'s default init: N(0, 1)."""
    nn.init.normal_(weight)


def _zero_bias(size: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(size))


class ColumnParallelLinear(nn.Module):
    """`y = x A^T + b` with `A` split along its output dim: each rank computes `out/tp` columns.

    Input: replicated `(..., in)`, or with `sequence_parallel` the sequence shard
    `(s/tp, b, in)`. Output: `(..., out/tp)`, or the full `(..., out)` with `gather_output`.
    `forward` returns the output, or `(output, bias)` with `skip_bias_add` (the bias, sharded
    like the output, is left for the caller to fuse into a later op).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        tp_group=None,
        bias: bool = True,
        gather_output: bool = False,
        init_method: InitMethod | None = None,
        sequence_parallel: bool = False,
        skip_bias_add: bool = False,
    ):
        super().__init__()
        if gather_output and sequence_parallel:
            raise ValueError(
                "ColumnParallelLinear: gather_output=True cannot be combined with "
                "sequence_parallel=True (its output would be neither sequence- nor "
                "tensor-sharded); leave gather_output False under sequence parallelism"
            )
        if gather_output and skip_bias_add:
            raise ValueError(
                "ColumnParallelLinear: gather_output=True with skip_bias_add=True would return "
                "a full output with a sharded bias; use one of them"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.tp_group = tp_group
        self.gather_output = gather_output
        self.sequence_parallel = sequence_parallel and group_size(tp_group) > 1
        self.skip_bias_add = skip_bias_add
        self.out_features_per_partition = divide(
            out_features, group_size(tp_group), "ColumnParallelLinear out_features"
        )
        # (out/tp, in): this rank's rows of the full (out, in) weight.
        self.weight = sharded_parameter(
            (out_features, in_features), 0, init_method or linear_default_init, tp_group
        )
        self.bias = None
        if bias:
            self.bias = _zero_bias(self.out_features_per_partition)
            set_tensor_model_parallel_attributes(self.bias, 0)

    def forward(self, x: torch.Tensor):
        if self.sequence_parallel:
            x = gather_from_sequence_parallel_region(x, self.tp_group)  # (s, b, in)
        else:
            x = copy_to_tensor_parallel_region(x, self.tp_group)
        bias = None if self.skip_bias_add else self.bias
        out = F.linear(x, self.weight, bias)  # (..., out/tp)
        if self.gather_output:
            out = gather_from_tensor_parallel_region(out, self.tp_group)  # (..., out)
        if self.skip_bias_add:
            return out, self.bias
        return out

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"tp={group_size(self.tp_group)}, bias={self.bias is not None}, "
            f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel}"
        )


class RowParallelLinear(nn.Module):
    """`y = x A^T + b` with `A` split along its input dim: partial products summed over tp.

    Input: `(..., in/tp)` (the output of a column-parallel layer), or the replicated
    `(..., in)` with `input_is_parallel=False`. Output: replicated `(..., out)`, or with
    `sequence_parallel` the sequence shard `(s/tp, b, out)`. The bias is replicated; under
    sequence parallelism it is marked `sequence_parallel` (its gradient needs the tp sum).
    `forward` returns the output, or `(output, bias)` with `skip_bias_add`.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        tp_group=None,
        bias: bool = True,
        input_is_parallel: bool = True,
        init_method: InitMethod | None = None,
        sequence_parallel: bool = False,
        skip_bias_add: bool = False,
    ):
        super().__init__()
        if sequence_parallel and not input_is_parallel:
            raise ValueError(
                "RowParallelLinear: sequence_parallel=True needs input_is_parallel=True "
                "(the input must already be split along the hidden dim)"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.tp_group = tp_group
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel = sequence_parallel and group_size(tp_group) > 1
        self.skip_bias_add = skip_bias_add
        self.in_features_per_partition = divide(
            in_features, group_size(tp_group), "RowParallelLinear in_features"
        )
        # (out, in/tp): this rank's columns of the full (out, in) weight.
        self.weight = sharded_parameter(
            (out_features, in_features), 1, init_method or linear_default_init, tp_group
        )
        self.bias = None
        if bias:
            self.bias = _zero_bias(out_features)
            if self.sequence_parallel:
                mark_sequence_parallel(self.bias)

    def forward(self, x: torch.Tensor):
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x, self.tp_group)  # (..., in/tp)
        partial = F.linear(x, self.weight)  # (..., out), summed over tp below
        if self.sequence_parallel:
            out = reduce_scatter_to_sequence_parallel_region(partial, self.tp_group)
        else:
            out = reduce_from_tensor_parallel_region(partial, self.tp_group)
        if self.skip_bias_add:
            return out, self.bias
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"tp={group_size(self.tp_group)}, bias={self.bias is not None}, "
            f"input_is_parallel={self.input_is_parallel}, "
            f"sequence_parallel={self.sequence_parallel}"
        )


class VocabParallelEmbedding(nn.Module):
    """Embedding table split along the vocabulary: rank r holds rows `[r*V/tp, (r+1)*V/tp)`.

    Input: token ids `(...)`, identical on every tp rank. Output: replicated `(..., dim)`;
    each rank looks up the ids in its range, zeroes the others, and the results are summed.
    `num_embeddings` must be divisible by tp (`padded_vocab_size` is, by construction).
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        tp_group=None,
        init_method: InitMethod | None = None,
    ):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.tp_group = tp_group
        per_partition = divide(
            num_embeddings, group_size(tp_group), "VocabParallelEmbedding num_embeddings"
        )
        self.vocab_start_index = group_rank(tp_group) * per_partition
        self.vocab_end_index = self.vocab_start_index + per_partition
        # (V/tp, dim): this rank's rows of the full (V, dim) table.
        self.weight = sharded_parameter(
            (num_embeddings, embedding_dim), 0, init_method or embedding_default_init, tp_group
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if group_size(self.tp_group) == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < self.vocab_start_index) | (ids >= self.vocab_end_index)
        local_ids = (ids - self.vocab_start_index).masked_fill(outside, 0)
        out = F.embedding(local_ids, self.weight)  # (..., dim), wrong rows where outside
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tensor_parallel_region(out, self.tp_group)

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, tp={group_size(self.tp_group)}, "
            f"rows=[{self.vocab_start_index}, {self.vocab_end_index})"
        )
