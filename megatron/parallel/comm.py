"""Collectives of device tensors (activations, gradients, norms), where `group=None` means
"a group of one process".

Everything in `megatron/parallel/` passes process groups explicitly. Unlike `torch.distributed`,
where `group=None` is the WORLD group, here a `None` group stands for a group of one process
(tensor-parallel size 1, or `torch.distributed` not initialised): every collective is then the
identity and costs nothing. The autograd functions in `mappings.py` are built on these.

These and `host_values.py` (numbers and flags built on the host) are the package's only calls
of `torch.distributed` collectives. Each refuses a CPU tensor on a group whose backend cannot
reduce one (NCCL), so a value that missed its way to the device fails on the first CPU gloo
test that gives the group an NCCL name, not on a user's first multi-GPU run.

A `planned.PlannedGroup` (the memory plan's group without processes) is answered here too: its
size and rank, and for each collective a `meta` tensor of the real result's shape, the bytes
handed in recorded on the group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.parallel.host_values import collective_device
from megatron.parallel.planned import is_planned

# torch 2.13 renamed the flat-tensor collectives; older releases only have the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def group_size(group) -> int:
    """Number of processes in `group` (1 for `None`)."""
    if group is None:
        return 1
    return group.size if is_planned(group) else dist.get_world_size(group)


def group_rank(group) -> int:
    """This process's index inside `group` (0 for `None`)."""
    if group is None:
        return 0
    return group.rank if is_planned(group) else dist.get_rank(group)


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


def check_placement(x: torch.Tensor, group) -> None:
    """Raise when `x` lives on the host but `group`'s backend reduces device tensors only.

    Only host tensors are looked at, so a GPU run pays one attribute read per collective."""
    if x.is_cpu and collective_device(group).type != "cpu":
        raise RuntimeError(
            f"a CPU tensor of shape {tuple(x.shape)} was handed to a collective over a "
            f"{dist.get_backend(group)} process group, which reduces "
            f"{collective_device(group).type} tensors only: build it on the device, or pass "
            "host values through megatron.parallel.host_values"
        )


def all_reduce(x: torch.Tensor, group, op: str = "sum") -> torch.Tensor:
    """Reduce `x` over `group` in place (`op`: sum or max); return it."""
    if group_size(group) == 1:
        return x
    if is_planned(group):
        group.record("all_reduce", x)
        return x
    check_placement(x, group)
    flat = x.contiguous()  # x itself unless it is a strided view
    dist.all_reduce(flat, op=_OPS[op], group=group)
    if flat.data_ptr() != x.data_ptr():
        x.copy_(flat)
    return x


def broadcast(x: torch.Tensor, src: int, group) -> torch.Tensor:
    """Global rank `src`'s `x` on every rank of `group` (in place); return it."""
    if group_size(group) == 1:
        return x
    if is_planned(group):
        group.record("broadcast", x)
        return x
    check_placement(x, group)
    dist.broadcast(x, src, group=group)
    return x


def send(x: torch.Tensor, dst: int) -> None:
    """Point to point: `x` to global rank `dst` (which calls `recv`)."""
    check_placement(x, dist.group.WORLD)
    dist.send(x, dst)


def recv(x: torch.Tensor, src: int) -> torch.Tensor:
    """Point to point: fill `x` from global rank `src` (which calls `send`); return it."""
    check_placement(x, dist.group.WORLD)
    dist.recv(x, src)
    return x


def all_gather_list(x: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's `x` (same shape on all ranks) in rank order."""
    if group_size(group) == 1:
        return [x]
    if is_planned(group):
        group.record("all_gather", x)
        return [x if i == group.rank else torch.empty_like(x) for i in range(group.size)]
    check_placement(x, group)
    parts = [torch.empty_like(x) for _ in range(group_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return parts


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
    if is_planned(group):
        group.record("all_gather", x)
        shape = list(x.shape)
        shape[dim] *= size
        return x.new_empty(shape)
    check_placement(x, group)
    x = x.contiguous()
    if dim % x.dim() == 0:
        # Dim 0 (the sequence dim of the (s, b, h) layout) gathers straight into one buffer.
        out = x.new_empty((size * x.shape[0],) + tuple(x.shape[1:]))
        _all_gather_flat(out, x, group=group)
        return out
    return torch.cat(all_gather_list(x, group), dim=dim)


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
    out_shape = (x.shape[0] // size,) + tuple(x.shape[1:])
    if is_planned(group):
        group.record("reduce_scatter", x)
        return x.new_empty(out_shape)
    check_placement(x, group)
    x = x.contiguous()
    out = x.new_empty(out_shape)
    _reduce_scatter_flat(out, x, group=group)
    return out
