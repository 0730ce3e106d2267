"""Tensor-parallel parameters: creation of shards, their marks, gathering, and SP grad sync.

Marks set on parameters (Megatron's names, which DeepSpeed also reads for gradient norms):

- `param.tensor_model_parallel = True`: the rank holds a 1/tp slice of the full tensor (the
  whole tensor at tp=1), split along `param.partition_dim` (`param.partition_stride` is 1).
  Parameters without the mark (norm weights, row-parallel biases) are replicated on every
  tensor-parallel rank.
- `param.sequence_parallel = True`: a replicated parameter used inside the sequence-parallel
  region (norm weights, the row-parallel bias). Each rank sees only its chunk of the sequence,
  so its gradient is partial and must be summed over the tensor-parallel group, either by
  `register_sequence_parallel_grad_hooks` (for the DeepSpeed engines: ZeRO consumes gradients
  during backward, so the sum must happen as each gradient is produced) or by
  `allreduce_sequence_parallel_grads` after backward (plain training loops, tests).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from megatron.parallel.comm import all_gather_along, all_reduce, group_size, split_along

InitMethod = Callable[[torch.Tensor], object]


def set_tensor_model_parallel_attributes(param: torch.Tensor, partition_dim: int) -> None:
    """Mark `param` as a tensor-parallel shard split along `partition_dim`."""
    param.tensor_model_parallel = True
    param.partition_dim = partition_dim
    param.partition_stride = 1


def is_tensor_parallel(param: torch.Tensor) -> bool:
    """True when `param` is a tensor-parallel shard (see the module docstring)."""
    return bool(getattr(param, "tensor_model_parallel", False))


def mark_sequence_parallel(param: torch.Tensor) -> None:
    """Mark a replicated parameter whose gradient must be summed over tp under SP."""
    param.sequence_parallel = True


def sharded_parameter(
    full_shape: tuple[int, ...], partition_dim: int, init_method: InitMethod, tp_group
) -> torch.nn.Parameter:
    """Create the full tensor, run `init_method` on it, and keep this rank's slice.

    Every rank draws the FULL tensor from its current RNG and keeps its slice, so the same
    seed gives the same full model at any tensor-parallel size (what parity tests and resuming
    at another tp rely on). The full tensor exists only transiently, on the CPU, in the default
    dtype.
    """
    full = torch.empty(full_shape)
    init_method(full)
    shard = split_along(full, partition_dim, tp_group).clone()
    param = torch.nn.Parameter(shard)
    set_tensor_model_parallel_attributes(param, partition_dim)
    return param


def gather_full_parameter(param: torch.Tensor, tp_group, *, grad: bool = False) -> torch.Tensor:
    """The full (unsharded) tensor of a parameter, or of its gradient with `grad=True`.

    Collective over `tp_group` for tensor-parallel shards (every rank of the group must call
    it); replicated parameters are returned as a detached copy. Used by tests and checkpoint
    conversion.
    """
    tensor = param.grad if grad else param
    if tensor is None:
        raise ValueError("gather_full_parameter(grad=True) on a parameter that has no .grad yet")
    tensor = tensor.detach()
    if not is_tensor_parallel(param) or group_size(tp_group) == 1:
        return tensor.clone()
    return all_gather_along(tensor, param.partition_dim, tp_group)


def sequence_parallel_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trainable parameters of `module` marked with `mark_sequence_parallel`."""
    return [
        p for p in module.parameters() if p.requires_grad and getattr(p, "sequence_parallel", False)
    ]


def allreduce_sequence_parallel_grads(module: torch.nn.Module, tp_group) -> None:
    """Sum the gradients of `module`'s sequence-parallel parameters over `tp_group`.

    Call once after backward (all tp ranks, same module structure). One flat all-reduce.
    """
    if group_size(tp_group) == 1:
        return
    grads = [p.grad for p in sequence_parallel_parameters(module) if p.grad is not None]
    if not grads:
        return
    flat = all_reduce(torch.cat([g.reshape(-1) for g in grads]), tp_group)
    for g, summed in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(summed.view_as(g))


def register_sequence_parallel_grad_hooks(module: torch.nn.Module, tp_group) -> list:
    """Sum each sequence-parallel gradient over `tp_group` as soon as backward produces it.

    Returns the hook handles (call `.remove()` to undo). Every tp rank runs the same backward
    graph, so the hooks fire, and their all-reduces match up, in the same order on each rank.
    No-op (empty list) without tensor parallelism.
    """
    if group_size(tp_group) == 1:
        return []
    return [
        p.register_hook(lambda grad: all_reduce(grad.clone(), tp_group))
        for p in sequence_parallel_parameters(module)
    ]
