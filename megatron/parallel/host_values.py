"""Host values (Python numbers, flags, CPU tensors) reduced or broadcast over a process group.

    sums = reduce_host([loss_sum, count], topology.dp_group)          # CPU float64, every rank
    stop = reduce_host([flag], world_group(), op="max")[0] > 0
    free = broadcast_host([free_bytes], src=0, group=world_group())[0]

This is the only way the package hands a value it built on the host to a collective. An NCCL
process group has a backend for CUDA tensors only (`all_reduce` of a CPU tensor raises "No
backend type associated with device type cpu"), gloo reduces CPU tensors, and a metric, a
flag or a count is born on the host: so the value is copied to the device the group's
backend needs (`collective_device`), reduced there in a dtype every backend reduces exactly
(int64 for integers and flags, float64 otherwise), and handed back on the host. A test scans
the package so that nothing else calls a `torch.distributed` collective (`tests/unit/
parallel/test_collective_sites.py`); the device-tensor collectives live in `comm.py`.

`group=None` means a group of one process (as everywhere in `megatron/parallel/`): the values
come back unchanged. `world_group()` is the whole world, or None before
`torch.distributed` is initialised.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

# The device each backend reduces tensors on. gloo, MPI and oneCCL take CPU tensors; NCCL
# (and its AMD twin RCCL, which torch also calls "nccl") takes CUDA tensors only.
_BACKEND_DEVICES = {"gloo": "cpu", "mpi": "cpu", "ccl": "cpu", "nccl": "cuda", "xccl": "xpu"}
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def world_group():
    """The WORLD group, or None (one process) when `torch.distributed` is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.group.WORLD


def _device_type(backend: str) -> str:
    """The device type a backend name reduces on; `"cpu:gloo,cuda:nccl"` lists several."""
    kinds = []
    for part in str(backend).lower().split(","):
        device, _, name = part.strip().rpartition(":")
        kinds.append(device or _BACKEND_DEVICES.get(name))
    if "cpu" in kinds:
        return "cpu"  # a host value then needs no copy at all
    known = [k for k in kinds if k]
    if not known:
        raise ValueError(
            f"process-group backend {backend!r}: no known device for it (known: "
            f"{', '.join(sorted(_BACKEND_DEVICES))})"
        )
    return known[0]


def collective_device(group=None, backend: str | None = None) -> torch.device:
    """The device on which `group`'s backend (or the backend named `backend`) reduces.

    An accelerator device is the process's current one (DeepSpeed sets it to the local rank)."""
    if backend is None:
        backend = dist.get_backend(group)
    kind = _device_type(backend)
    if kind == "cpu":
        return torch.device("cpu")
    module = getattr(torch, kind)
    return torch.device(kind, module.current_device())


def _size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _exact_dtype(values: torch.Tensor) -> torch.dtype:
    if values.dtype == torch.bool or not values.is_floating_point():
        return torch.int64
    return torch.float64


def _on_device(values, group, backend) -> torch.Tensor:
    values = torch.as_tensor(values)
    dtype = _exact_dtype(values)
    return values.detach().to(device=collective_device(group, backend), dtype=dtype).contiguous()


def reduce_host(
    values: Sequence | torch.Tensor, group, op: str = "sum", backend: str | None = None
) -> torch.Tensor:
    """`values` reduced (`op`: sum, max or min) over `group`, as a CPU int64/float64 tensor
    equal on every rank (collective: every rank of `group` calls it)."""
    if op not in _OPS:
        raise ValueError(f"reduce_host: op {op!r} is not one of {', '.join(_OPS)}")
    if _size(group) == 1:
        values = torch.as_tensor(values)
        return values.detach().to(device="cpu", dtype=_exact_dtype(values)).clone()
    tensor = _on_device(values, group, backend)
    dist.all_reduce(tensor, op=_OPS[op], group=group)
    return tensor.cpu()


def broadcast_host(
    values: Sequence | torch.Tensor, src: int, group, backend: str | None = None
) -> torch.Tensor:
    """Global rank `src`'s `values` on every rank of `group`, as a CPU int64/float64 tensor
    (collective; every rank passes values of the same shape and kind)."""
    if _size(group) == 1:
        values = torch.as_tensor(values)
        return values.detach().to(device="cpu", dtype=_exact_dtype(values)).clone()
    tensor = _on_device(values, group, backend)
    dist.broadcast(tensor, src, group=group)
    return tensor.cpu()
