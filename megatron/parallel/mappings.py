"""Autograd functions that move activations in and out of the tensor-parallel region.

Each forward collective is paired with its adjoint in backward, so a tensor-parallel layer
written with these gets correct gradients without any hand-written communication:

| function                                   | forward                  | backward                 |
| ------------------------------------------ | ------------------------ | ------------------------ |
| `copy_to_tensor_parallel_region`           | identity                 | all-reduce               |
| `reduce_from_tensor_parallel_region`       | all-reduce               | identity                 |
| `scatter_to_tensor_parallel_region`        | split last dim           | all-gather last dim      |
| `gather_from_tensor_parallel_region`       | all-gather last dim      | split last dim           |
| `scatter_to_sequence_parallel_region`      | split dim 0              | all-gather dim 0         |
| `gather_from_sequence_parallel_region`     | all-gather dim 0         | reduce-scatter dim 0 (*) |
| `reduce_scatter_to_sequence_parallel_region` | reduce-scatter dim 0   | all-gather dim 0         |

(*) or a plain split with `tensor_parallel_output_grad=False`, for a gathered tensor whose
consumers are replicated (each rank then already holds the full gradient).

Sequence-parallel functions use the Megatron activation layout (seq, batch, hidden): dim 0 is
the sequence. Every function takes the tensor-parallel `group`; `group=None` (or a group of one)
makes it the identity, so layers built on them also run without tensor parallelism.
"""

from __future__ import annotations

import torch

from megatron.parallel.comm import (
    all_gather_along,
    all_reduce,
    group_size,
    reduce_scatter_dim0,
    split_along,
)


class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.clone(), ctx.group), None


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return split_along(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, -1, ctx.group), None


class _GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_along(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return split_along(grad, -1, ctx.group), None


class _ScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return split_along(x, 0, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, 0, ctx.group), None


class _GatherFromSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, tensor_parallel_output_grad):
        ctx.group = group
        ctx.tensor_parallel_output_grad = tensor_parallel_output_grad
        return all_gather_along(x, 0, group)

    @staticmethod
    def backward(ctx, grad):
        if ctx.tensor_parallel_output_grad:
            # Consumers were tensor-parallel: each rank holds a partial gradient of the full
            # sequence; sum them and keep this rank's sequence chunk.
            return reduce_scatter_dim0(grad, ctx.group), None, None
        return split_along(grad, 0, ctx.group), None, None


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_dim0(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along(grad, 0, ctx.group), None


def copy_to_tensor_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    """Enter the region with a replicated input: identity forward, all-reduce of grads."""
    if group_size(group) == 1:
        return x
    return _CopyToRegion.apply(x, group)


def reduce_from_tensor_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    """Leave the region by summing partial results: all-reduce forward, identity backward."""
    if group_size(group) == 1:
        return x
    return _ReduceFromRegion.apply(x, group)


def scatter_to_tensor_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    """Keep this rank's chunk of the last dim `(..., h) -> (..., h/tp)`; grads are gathered."""
    if group_size(group) == 1:
        return x
    return _ScatterToRegion.apply(x, group)


def gather_from_tensor_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    """Concatenate the ranks' chunks of the last dim `(..., h/tp) -> (..., h)`."""
    if group_size(group) == 1:
        return x
    return _GatherFromRegion.apply(x, group)


def scatter_to_sequence_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    """Keep this rank's sequence chunk `(s, b, h) -> (s/tp, b, h)`; grads are all-gathered."""
    if group_size(group) == 1:
        return x
    return _ScatterToSequenceRegion.apply(x, group)


def gather_from_sequence_parallel_region(
    x: torch.Tensor, group, tensor_parallel_output_grad: bool = True
) -> torch.Tensor:
    """All-gather the sequence `(s/tp, b, h) -> (s, b, h)`.

    Backward reduce-scatters (the gathered tensor feeds tensor-parallel layers, whose input
    gradients are partial sums), or just splits when `tensor_parallel_output_grad=False`.
    """
    if group_size(group) == 1:
        return x
    return _GatherFromSequenceRegion.apply(x, group, tensor_parallel_output_grad)


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    """Sum partial results and keep this rank's sequence chunk `(s, b, h) -> (s/tp, b, h)`."""
    if group_size(group) == 1:
        return x
    return _ReduceScatterToSequenceRegion.apply(x, group)
