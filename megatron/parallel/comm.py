"""Collectives along one tensor dimension, where `group=None` means "no tensor parallelism".

Everything in `megatron/parallel/` passes process groups explicitly. Unlike `torch.distributed`,
where `group=None` is the WORLD group, here a `None` group stands for a group of one process
(tensor-parallel size 1, or `torch.distributed` not initialised): every collective is then the
identity and costs nothing. The autograd functions in `mappings.py` are built on these.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# torch 2.13 renamed the flat-tensor collectives; older releases only have the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def group_size(group) -> int:
    """Number of processes in `group` (1 for `None`)."""
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group) -> int:
    """This process's index inside `group` (0 for `None`)."""
    return 0 if group is None else dist.get_rank(group)


def divide(numerator: int, denominator: int, what: str) -> int:
    """`numerator // denominator`, raising a `ValueError` that names `what` when it is not exact.

    `what` describes the quantity being split, e.g. "ColumnParallelLinear out_features".
    """
    if numerator % denominator != 0:
        raise ValueError(
            f"{what} = {numerator} is not divisible by the tensor-parallel size {denominator}; "
            f"choose a value that is a multiple of {denominator} (or another "
            "model_parallel_size)."
        )
    return numerator // denominator


def all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    """Sum `x` over `group` (in place when there is more than one process); return it."""
    if group_size(group) == 1:
        return x
    x = x.contiguous()
    dist.all_reduce(x, group=group)
    return x


def split_along(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """This rank's contiguous `1/size` chunk of `x` along `dim` (the input must divide evenly)."""
    size = group_size(group)
    if size == 1:
        return x
    if x.shape[dim] % size != 0:
        raise ValueError(
            f"cannot split a tensor of shape {tuple(x.shape)} along dim {dim} over "
            f"{size} tensor-parallel ranks: {x.shape[dim]} is not divisible by {size}"
        )
    return x.chunk(size, dim=dim)[group_rank(group)].contiguous()


def all_gather_along(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Concatenate the `x` of every rank of `group` along `dim`, in rank order."""
    size = group_size(group)
    if size == 1:
        return x
    x = x.contiguous()
    if dim % x.dim() == 0:
        # Dim 0 (the sequence dim of the (s, b, h) layout) gathers straight into one buffer.
        out = x.new_empty((size * x.shape[0],) + tuple(x.shape[1:]))
        _all_gather_flat(out, x, group=group)
        return out
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def reduce_scatter_dim0(x: torch.Tensor, group) -> torch.Tensor:
    """Sum `x` over `group` and keep this rank's `1/size` chunk of dim 0."""
    size = group_size(group)
    if size == 1:
        return x
    if x.shape[0] % size != 0:
        raise ValueError(
            f"cannot reduce-scatter a tensor of shape {tuple(x.shape)} over {size} "
            f"tensor-parallel ranks: dim 0 ({x.shape[0]}, the sequence length) is not "
            f"divisible by {size}"
        )
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // size,) + tuple(x.shape[1:]))
    _reduce_scatter_flat(out, x, group=group)
    return out
