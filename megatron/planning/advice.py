"""What would make a plan that does not fit, fit: each single change re-planned, smallest first.

1. a smaller micro batch: the largest that divides the step's samples per rank, with the
   gradient accumulation that keeps the global batch, and the largest of all (found by
   halving) where that is larger;
2. activation checkpointing of every layer, where it is off;
3. the next ZeRO stage (1 at most on the pipeline engine, which has no ZeRO 2 or 3);
4. twice the tensor-parallel size;
5. twice the pipeline stages.

`replan(overrides)` plans the same config files with `--set` overrides (a dict of flat keys) and
raises `ConfigError` (or `ValueError`) where the change is not a valid config: such a change
is skipped.
"""

from __future__ import annotations

from collections.abc import Callable

from megatron.config import ConfigError
from megatron.planning.plan import RunPlan

GIB = 2**30


def _fits(replan, overrides: dict) -> RunPlan | None:
    try:
        plan = replan(overrides)
    except (ConfigError, ValueError):
        return None
    return plan if plan.fits else None


def _micro_batch(plan: RunPlan, cfg, replan) -> tuple[dict, RunPlan] | None:
    size, m = cfg.training.train_micro_batch_size_per_gpu, plan.layout.micro_batches
    best, low, high = None, 1, size - 1
    while low <= high:  # the largest micro batch that fits: memory grows with it
        mid = (low + high) // 2
        keys = {"train_micro_batch_size_per_gpu": mid}
        if (size * m) % mid == 0:
            keys["gradient_accumulation_steps"] = size * m // mid
        found = _fits(replan, keys)
        if found:
            best, low = (keys, found), mid + 1
        else:
            high = mid - 1
    return best


def _keeping_the_batch(found, cfg, replan) -> tuple[dict, RunPlan] | None:
    """The largest micro batch up to `found`'s that divides the step's samples per rank, with
    the gradient accumulation that keeps the global batch (it fits: memory grows with the
    micro batch); `found` itself where it divides them."""
    keys, plan = found
    t = cfg.training
    samples = t.train_micro_batch_size_per_gpu * t.gradient_accumulation_steps
    b = keys["train_micro_batch_size_per_gpu"]
    divisor = max(d for d in range(1, b + 1) if samples % d == 0)
    if divisor == b:
        return found
    keys = {"train_micro_batch_size_per_gpu": divisor,
            "gradient_accumulation_steps": samples // divisor}  # fmt: skip
    return keys, replan(keys)


def _describe(keys: dict, plan: RunPlan) -> str:
    settings = ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}"
                         for k, v in keys.items())  # fmt: skip
    total, memory = plan.heaviest.total / GIB, plan.machine.memory / GIB
    return f"{settings} (then {total:.2f} of {memory:.2f} GiB)"


def fitting_changes(plan: RunPlan, cfg, replan: Callable[[dict], RunPlan]) -> list[str]:
    """The single changes of the module docstring that make `plan` fit, in that order (none
    when it fits or its memory is unknown)."""
    if plan.fits is not False:
        return []
    found = []
    small = _micro_batch(plan, cfg, replan)
    if small:
        kept = _keeping_the_batch(small, cfg, replan)
        found.append(_describe(*kept) + " (keeps the global batch)")
        if kept[0] != small[0]:
            found.append(_describe(*small) + " (the largest micro batch that fits)")
    candidates = []
    if not cfg.model.checkpoint_activations:
        candidates.append({"checkpoint_activations": True, "checkpoint_num_layers": 1})
    stage, top = plan.layout.zero_stage, 1 if plan.layout.pipeline else 3
    if stage < top:
        zero = dict(cfg.parallel.zero_optimization or {}, stage=stage + 1)
        candidates.append({"zero_optimization": zero})
    candidates.append({"model_parallel_size": 2 * plan.layout.tp})
    if plan.layout.pipeline:
        candidates.append({"pipe_parallel_size": 2 * plan.layout.pp})
    for keys in candidates:
        fitted = _fits(replan, keys)
        if fitted:
            found.append(_describe(keys, fitted))
    return found or ["no single change of micro batch, checkpointing, ZeRO stage, tensor or "
                     "pipeline parallelism fits: combine them, or use more GPUs"]  # fmt: skip
