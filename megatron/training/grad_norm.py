"""The global gradient norm over tensor- and pipeline-parallel shards, and clipping by it.

DeepSpeed's fp32 path without ZeRO clips with a norm that, under its pipeline engine, is
not summed over the pipeline stages (each stage clips by its own partial norm), so a
pipeline run would not match the same run on the plain engine or with ZeRO. The engine's
`clip_fp32_gradients` is therefore replaced by `clip_by_global_norm` (`engine_setup.py`),
which counts every gradient once:

* a tensor-parallel shard on every tensor-parallel rank; a replicated parameter on
  tensor-parallel rank 0 only;
* a tied parameter's copy on a later pipeline stage (`ds_pipe_replicated`) not at all;
* summed (of squares) over the tensor- and pipeline-parallel groups; data-parallel replicas
  hold the same averaged gradients, so they are not summed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.parallel import is_tensor_parallel


def global_grad_norm(parameters, topology) -> torch.Tensor:
    """2-norm of all gradients of the model (collective over tp and pp)."""
    parameters = [p for p in parameters if p.grad is not None]
    device = parameters[0].grad.device if parameters else torch.device("cpu")
    square = torch.zeros((), dtype=torch.float32, device=device)
    for p in parameters:
        if getattr(p, "ds_pipe_replicated", False):
            continue
        if topology.tp_rank == 0 or is_tensor_parallel(p):
            square += p.grad.detach().float().norm() ** 2
    for group in (topology.tp_group, topology.pp_group):
        if group is not None:
            dist.all_reduce(square, group=group)
    return square.sqrt()


def clip_by_global_norm(parameters, max_norm: float, topology) -> torch.Tensor:
    """Scale the gradients down so their global norm is at most `max_norm`; return the norm
    before clipping."""
    parameters = [p for p in parameters if p.grad is not None]
    norm = global_grad_norm(parameters, topology)
    if max_norm > 0:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for p in parameters:
            p.grad.detach().mul_(coef.to(p.grad.device))
    return norm
