"""The global gradient norm over tensor- and pipeline-parallel shards, and clipping by it.

DeepSpeed's fp32 path without ZeRO clips with a norm that, under its pipeline engine, is
not summed over the pipeline stages (each stage clips by its own partial norm), so a
pipeline run would not match the same run on the plain engine or with ZeRO. The engine's
`clip_fp32_gradients` is therefore replaced by `clip_by_global_norm` (`setup/engine.py`),
which counts every gradient once:

* a tensor-parallel shard on every tensor-parallel rank; a replicated parameter on
  tensor-parallel rank 0 only;
* a tied parameter's copy on a later pipeline stage (`ds_pipe_replicated`) not at all;
* summed (of squares) over the tensor- and pipeline-parallel groups; data-parallel replicas
  hold the same averaged gradients, so they are not summed; mixture-of-experts experts
  (`expert_parallel`) are summed over the expert-parallel group, whose ranks hold different
  experts.
"""

from __future__ import annotations

import torch

from megatron.parallel import is_tensor_parallel
from megatron.parallel.comm import all_reduce

# The engine attribute where the non-finite step check (`nonfinite.py`) leaves the global norm
# it computed for the step under way, so the clipping of that step (`setup/engine.py`) does not
# compute and all-reduce it a second time.
STEP_GRAD_NORM = "megatron_step_grad_norm"


def global_grad_norm(parameters, topology) -> torch.Tensor:
    """2-norm of all gradients of the model (collective over tp and pp)."""
    parameters = list(parameters)
    counted = [
        p
        for p in parameters
        if p.grad is not None
        and not getattr(p, "ds_pipe_replicated", False)
        and (topology.tp_rank == 0 or is_tensor_parallel(p))
    ]
    device = next((p.device for p in parameters), torch.device("cpu"))
    # Experts differ over the expert-parallel group (each rank holds its own): summed there.
    experts = [p.grad.detach() for p in counted if getattr(p, "expert_parallel", False)]
    dense = [p.grad.detach() for p in counted if not getattr(p, "expert_parallel", False)]
    square, expert_square = _square_sum(dense, device), _square_sum(experts, device)
    square = square + all_reduce(expert_square, getattr(topology, "ep_group", None))
    for group in (topology.tp_group, topology.pp_group):
        square = all_reduce(square, group)
    return square.sqrt()


def _square_sum(grads, device) -> torch.Tensor:
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    # one fused pass over all gradients, in fp32: a 16-bit norm of loss-scaled fp16 gradients
    # would overflow
    norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
    return torch.stack(norms).square().sum()


def clip_by_global_norm(parameters, max_norm: float, topology, norm=None) -> torch.Tensor:
    """Scale the gradients down so their global norm is at most `max_norm`; return the norm
    before clipping. `norm`: this step's `global_grad_norm`, when the caller has it already."""
    parameters = [p for p in parameters if p.grad is not None]
    if norm is None:
        norm = global_grad_norm(parameters, topology)
    if max_norm > 0 and parameters:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        torch._foreach_mul_([p.grad.detach() for p in parameters], coef)
    return norm


def clip_tensors_on_device(input_tensors, max_norm=1.0, global_norm=None, mpu=None, eps=1e-6):
    """DeepSpeed 0.19.8's `clip_tensors_by_global_norm` without its host read.

    DeepSpeed asks `if clip_coef < 1` of a coefficient computed on the device, a read per
    step, to skip a multiplication by a coefficient of at least 1. Here the coefficient is
    clamped to 1 on the device and every tensor is multiplied by it in one fused pass: below 1
    the same value multiplies the same tensors; otherwise a multiplication by exactly 1 changes
    nothing.
    """
    from deepspeed.runtime.utils import get_global_norm_of_tensors

    if global_norm is None:
        global_norm = get_global_norm_of_tensors(input_tensors, mpu=mpu)
    coef = max_norm / (global_norm + eps)
    coef = torch.clamp(coef, max=1.0) if torch.is_tensor(coef) else min(coef, 1.0)
    torch._foreach_mul_([t.detach() for t in input_tensors], coef)
    return global_norm


def clip_bf16_on_device(optimizer) -> None:
    """Make DeepSpeed's `BF16_Optimizer` (bf16 on the pipeline engine, and at ZeRO 1 on both)
    clip with `clip_tensors_on_device`: its step calls the clipping function it imported from
    `deepspeed.runtime.utils`, which no other DeepSpeed optimizer uses, so the name is rebound
    in its module (for every BF16_Optimizer of the process: the same results, without the
    read). Any other optimizer is left alone."""
    from deepspeed.runtime import bf16_optimizer

    if isinstance(optimizer, bf16_optimizer.BF16_Optimizer):
        bf16_optimizer.clip_tensors_by_global_norm = clip_tensors_on_device
