"""The DeepSpeed wrappers' step checks, moved to the device and read with the step's one flag
(`grad_norm.ZeroStepChecks`, `Zero3StepChecks`, `Bf16StepChecks`; at ZeRO 0
`fp16_scaler.UnfusedStepChecks`), train exactly as the wrappers' own steps: over two
data-parallel gloo ranks, each layout runs the same steps twice, with the checks on the device
and as the step does them (`zero_checks_on_device` made a no-op and the checks unlinked, so
the step computes and reads them itself), and every number of each step agrees: the loss,
whether the step was applied, the skipped-step count, the loss scale, the gradient norm
reported, and the weights after the last step.

The steps exercise each decision: clipping (`gradient_clipping` below every norm here), an
inf gradient under a finite loss (DeepSpeed's own overflow skip; fp16: the scale's hysteresis
and halving), and NaN weights, so a NaN loss and NaN gradients (our skip, then theirs).
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings
from tests.unit.training.test_fp16_engine_scaling import _allow_fp16_on_cpu

pytestmark = pytest.mark.slow

FP16 = dict(fp16={"enabled": True, "loss_scale": 0, "initial_scale_power": 8, "hysteresis": 2})
BF16 = dict(precision="bfloat16")
LAYOUTS = {
    "plain-fp32-zero1": dict(pipe_parallel_size=0, zero_optimization={"stage": 1}),
    "plain-fp32-zero2": dict(pipe_parallel_size=0, zero_optimization={"stage": 2}),
    "plain-bf16-zero2": dict(BF16, pipe_parallel_size=0, zero_optimization={"stage": 2}),
    "plain-fp16-zero1": dict(FP16, pipe_parallel_size=0, zero_optimization={"stage": 1}),
    "plain-fp16-zero2": dict(FP16, pipe_parallel_size=0, zero_optimization={"stage": 2}),
    "pipe-fp32-zero1": dict(pipe_parallel_size=1, zero_optimization={"stage": 1}),
    "pipe-fp16-zero1": dict(FP16, pipe_parallel_size=1, zero_optimization={"stage": 1}),
    "plain-fp32-zero3": dict(pipe_parallel_size=0, zero_optimization={"stage": 3}),
    "plain-bf16-zero3": dict(BF16, pipe_parallel_size=0, zero_optimization={"stage": 3}),
    "plain-fp16-zero3": dict(FP16, pipe_parallel_size=0, zero_optimization={"stage": 3}),
    # ZeRO 0: FP16_UnfusedOptimizer with our step (`fp16_scaler.step_on_device`)
    "plain-fp16-zero0": dict(FP16, pipe_parallel_size=0, zero_optimization={"stage": 0}),
    "plain-bf16-zero0": dict(BF16, pipe_parallel_size=0, zero_optimization={"stage": 0}),
    "pipe-fp16-zero0": dict(FP16, pipe_parallel_size=1, zero_optimization={"stage": 0}),
    # DeepSpeed's BF16_Optimizer
    "plain-bf16-zero1": dict(BF16, pipe_parallel_size=0, zero_optimization={"stage": 1}),
    "pipe-bf16-zero0": dict(BF16, pipe_parallel_size=1, zero_optimization={"stage": 0}),
    "pipe-bf16-zero1": dict(BF16, pipe_parallel_size=1, zero_optimization={"stage": 1}),
}
STEPS = 6
INF_GRAD_AT, NAN_WEIGHTS_AT = 1, 3


def _record(folder, layout, world_size, on_device=True) -> dict:
    """Train `STEPS` steps of `layout`; every number DeepSpeed's step decides, per step.
    `on_device` False: the wrapper's step checks as DeepSpeed's (ZeRO-0: `step_on_device`'s)
    step does them, reading them itself."""
    from megatron.data import build_tokenizer
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.batches import BatchSettings
    from megatron.training.setup.data import BatchFactory, build_datasets
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.grad_norm import WRAPPER_CHECKS
    from megatron.training.step.nonfinite import NonFiniteSteps
    from megatron.training.step.steps import engine_steps

    settings = tiny_settings(
        folder, save=None, load=None, train_iters=STEPS, hidden_dropout=0.0,
        attention_dropout=0.0, num_gpus=world_size, gradient_clipping=0.05, **LAYOUTS[layout],
    )  # fmt: skip
    cfg = resolve(settings, world_size)
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    tokenizer = build_tokenizer(cfg)
    parts = build_engine(cfg, topology, STEPS)
    engine = parts.engine
    if not on_device:
        vars(engine.optimizer).pop(WRAPPER_CHECKS, None)
    steps = engine_steps(engine, topology)
    NonFiniteSteps(engine, parts.optimizer, topology, steps.local_loss).install()
    batches = BatchFactory(cfg, topology, BatchSettings.from_config(cfg, tokenizer.eod),
                           engine.device)(build_datasets(cfg, STEPS)[0], 0)  # fmt: skip
    params = [p for p in engine.module.parameters() if p.requires_grad]
    inf_grad = [False]
    params[-1].register_hook(lambda g: g * math.inf if inf_grad[0] else g)
    out = {"loss": [], "applied": [], "scale": [], "norm": []}
    for step in range(STEPS):
        inf_grad[0] = step == INF_GRAD_AT
        # ZeRO 3: this rank's partition too (a small parameter stays gathered)
        first = [params[0].data, getattr(params[0], "ds_tensor", params[0].data)]
        saved = [t.detach().clone() for t in first]  # (twice the same tensor: no harm)
        if step == NAN_WEIGHTS_AT:
            torch._foreach_mul_(first, math.nan)
        out["loss"].append(steps.train_step(batches))
        if step == NAN_WEIGHTS_AT:
            torch._foreach_copy_(first, saved)  # the skipped step left the rest as it was
        out["applied"].append(steps.step_applied)
        out["scale"].append(float(getattr(engine.optimizer, "loss_scale", 1.0)))
        out["norm"].append(float(engine.get_global_grad_norm() or 0.0))
    out["skipped"] = engine.skipped_steps
    # ZeRO 3: this rank's partition
    out["weights"] = [
        getattr(p, "ds_tensor", p).detach().clone() for p in engine.module.parameters()
    ]
    return out


def _both_ways(rank, world_size, folder):
    import megatron.training.setup.engine as setup

    _allow_fp16_on_cpu()
    results = {}
    for layout in LAYOUTS:
        on_device = _record(f"{folder}/{layout}-on", layout, world_size)
        checks, setup.zero_checks_on_device = setup.zero_checks_on_device, lambda optimizer: None
        try:
            theirs = _record(f"{folder}/{layout}-off", layout, world_size, on_device=False)
        finally:
            setup.zero_checks_on_device = checks
        # tensors do not travel back through the queue: their comparison does
        same = [torch.equal(a, b) for a, b in zip(on_device.pop("weights"), theirs.pop("weights"))]
        results[layout] = (on_device, theirs, all(same))
    return results


def _close(a, b) -> bool:
    return all(x == y or (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-6)
               for x, y in zip(a, b, strict=True))  # fmt: skip


def test_zero_checks_on_the_device_train_as_deepspeeds_own(tmp_path):
    for rank, results in enumerate(run_distributed(_both_ways, 2, str(tmp_path), timeout=900)):
        for layout, (ours, theirs, same_weights) in results.items():
            where = f"{layout} rank {rank}"
            assert ours["applied"] == theirs["applied"], (where, ours, theirs)
            assert not ours["applied"][INF_GRAD_AT], where
            assert not ours["applied"][NAN_WEIGHTS_AT], where
            assert all(ours["applied"][s] for s in (0, 2, 4, 5)), (where, ours["applied"])
            assert ours["skipped"] == theirs["skipped"] == 2, where
            for key in ("loss", "scale", "norm"):
                assert _close(ours[key], theirs[key]), (where, key, ours[key], theirs[key])
            assert same_weights, where
