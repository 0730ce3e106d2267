"""DeepSpeed's `BF16_Optimizer` (bf16 on the pipeline engine, and at ZeRO 1 on both engines)
with its per-tensor loops as one fused op each.

On a GPU each op costs the host a few microseconds to queue. DeepSpeed 0.19.8's wrapper adds
each bf16 gradient into its fp32 accumulator one tensor at a time at the end of every backward
(`update_hp_grads`: a cast, a view and an add per tensor, ~740 host ops a step at 160M), and
its gradient norm takes one `norm` per tensor (~300 more). Here:

- `fuse_hp_grad_updates` makes `update_hp_grads` one `_foreach_add_` per parameter group: the
  fp32 accumulators plus the bf16 gradients, promoted to fp32 (the cast of DeepSpeed's
  `add_(grad.to(fp32))`, exactly); the bookkeeping (`_hp_grad`, `fp32_groups_has_gradients`,
  clearing) as DeepSpeed does it. With `immediate_grad_update` (accumulated in hooks) or
  AutoEP's folding correction (per tensor by nature) DeepSpeed's own loop runs.
- `foreach_global_norm` is DeepSpeed's `get_global_norm_of_tensors` for a p-norm without
  experts: the tensors' norms from one `_foreach_norm`, in fp32, summed as powers, all-reduced
  over the model-parallel group and masked to -1 where not finite, as DeepSpeed does.
"""

from __future__ import annotations

import torch

from megatron.parallel.comm import all_reduce


def fuse_hp_grad_updates(optimizer) -> None:
    """Replace a `BF16_Optimizer`'s `update_hp_grads` (see the module docstring); any other
    optimizer is left alone."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    if not isinstance(optimizer, BF16_Optimizer):
        return
    loop = optimizer.update_hp_grads

    @torch.no_grad()
    def update_hp_grads(clear_lp_grads=False):
        if optimizer.immediate_grad_update or optimizer.autoep_folding_tp_group is not None:
            return loop(clear_lp_grads=clear_lp_grads)
        for i, group in enumerate(optimizer.bf16_groups):
            _add_group(optimizer, i, group, clear_lp_grads)

    optimizer.update_hp_grads = update_hp_grads


def _add_group(optimizer, i: int, group, clear_lp_grads: bool) -> None:
    accumulators, grads = [], []
    for j, lp in enumerate(group):
        if lp.grad is None:
            continue
        hp_grad = optimizer.fp32_groups_gradients[i][j]
        if hp_grad is None:
            raise AssertionError(f"BF16_Optimizer: no fp32 gradient for parameter [{i}][{j}]")
        grad = lp.grad if lp.grad.shape == hp_grad.shape else lp.grad.view(hp_grad.shape)
        accumulators.append(hp_grad)
        grads.append(grad)
        lp._hp_grad = hp_grad
        optimizer.fp32_groups_has_gradients[i][j] = True
    if accumulators:
        torch._foreach_add_(accumulators, grads)
        if clear_lp_grads:
            torch._foreach_zero_(grads)


def foreach_global_norm(tensors, mpu=None, norm_type: float = 2.0) -> torch.Tensor:
    """DeepSpeed 0.19.8's `get_global_norm_of_tensors(tensors, norm_type, mpu)` without experts,
    for a finite p (the infinity norm: DeepSpeed's own)."""
    from deepspeed.runtime.utils import get_global_norm_of_tensors, mask_nan_or_inf_with_val_inplace

    norm_type = float(norm_type)
    if norm_type == float("inf") or not tensors:
        return get_global_norm_of_tensors(tensors, norm_type=norm_type, mpu=mpu)
    norms = torch._foreach_norm(list(tensors), norm_type, dtype=torch.float32)
    total = torch.stack(norms).pow(norm_type).sum()
    if mpu is not None:
        all_reduce(total, mpu.get_model_parallel_group())
    total = total.pow(1.0 / norm_type)
    mask_nan_or_inf_with_val_inplace(total, device=total.device)
    return total
