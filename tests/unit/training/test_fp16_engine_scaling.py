"""fp16 dynamic loss scaling of the engines the trainer builds (`engine_setup.build_engine`).

DeepSpeed refuses fp16 on a CPU without native fp16 kernels; that is a capability check,
torch computes fp16 on any CPU. The worker answers it with "supported", so the real fp16
engines (plain and pipeline at ZeRO 0, plain at ZeRO 1 and 3) are built and trained here. Their
scale must follow DeepSpeed's (GPT-NeoX's) dynamic loss scaling rule, written below from its
definition: `hysteresis` overflows before the scale halves, growth after `loss_scale_window`
clean steps (refilling the hysteresis), never below `min_loss_scale`.
"""

from __future__ import annotations

import pytest

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

FP16 = {"loss_scale": 0, "initial_scale_power": 10, "loss_scale_window": 2, "hysteresis": 2,
        "min_loss_scale": 256}  # fmt: skip
OVER, CLEAN = True, False
STEPS = [OVER] * 4 + [CLEAN] * 3 + [OVER] + [CLEAN] * 3 + [OVER] * 2 + [CLEAN]
LAYOUTS = {
    "plain_zero0": dict(pipe_parallel_size=0),
    "pipeline_zero0": dict(pipe_parallel_size=1),
    "plain_zero1": dict(pipe_parallel_size=0, zero_optimization={"stage": 1}),
    "plain_zero3": dict(pipe_parallel_size=0, zero_optimization={"stage": 3}),
}


class ReferenceScaler:
    """DeepSpeed's `DynamicLossScaler` rule (what GPT-NeoX runs), from its definition.

    An overflow: if fewer than `hysteresis` overflows have been absorbed since the scale last
    grew, absorb it; else halve the scale, not below `min_scale`. A clean step that follows a
    run of clean steps whose length is a positive multiple of `window`: double the scale and
    forget the absorbed overflows.
    """

    def __init__(self, scale, window, hysteresis, min_scale):
        self.scale, self.window, self.min_scale = scale, window, min_scale
        self.hysteresis = self.left = hysteresis
        self.run = 0  # clean steps in a row before this one

    def update(self, overflow: bool) -> float:
        if overflow:
            self.run = 0
            if self.left > 1:
                self.left -= 1
            else:
                self.scale = max(self.scale / 2, self.min_scale)
        else:
            if self.run > 0 and self.run % self.window == 0:
                self.scale *= 2
                self.left = self.hysteresis
            self.run += 1
        return self.scale


def _expected_scales(steps) -> list[float]:
    ref = ReferenceScaler(2.0 ** FP16["initial_scale_power"], FP16["loss_scale_window"],
                          FP16["hysteresis"], FP16["min_loss_scale"])  # fmt: skip
    return [ref.update(overflow) for overflow in steps]


def _allow_fp16_on_cpu():
    from deepspeed.accelerator import get_accelerator

    type(get_accelerator()).is_fp16_supported = lambda self: True


def _engine(folder, layout):
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.engine import build_engine

    settings = tiny_settings(folder, hidden_dropout=0.0, attention_dropout=0.0, save=None,
                             load=None, checkpoint_factor=None, fp16=FP16)  # fmt: skip
    cfg = resolve({**settings, **LAYOUTS[layout]}, 1)
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    return build_engine(cfg, topology, cfg.training.train_iters).engine, topology


def _drive(engine, steps) -> list[float]:
    """Feed overflowing/clean steps to the engine's own optimizer; the scale after each."""
    import torch

    optimizer, scales = engine.optimizer, []
    for overflow in steps:
        if not hasattr(optimizer, "loss_scale_config"):  # ZeRO: what its step() calls
            optimizer.loss_scaler.update_scale(overflow)
        else:  # FP16_UnfusedOptimizer: its real step, on gradients set on the fp16 weights
            for p in engine.module.parameters():
                p.grad = torch.full_like(p, 1e-3)
            if overflow:
                p.grad.view(-1)[0] = float("inf")
            optimizer.step()
        scales.append(float(optimizer.loss_scale))
    return scales


def _batches(n):
    import torch

    g = torch.Generator().manual_seed(0)
    tokens, labels = torch.randint(0, 500, (2, 2, 32), generator=g)
    batch = ((tokens, torch.arange(32).expand(2, 32)), (labels, torch.ones(2, 32)))
    return iter([batch] * n)


def _resume_from_a_neox_scaler(engine, folder, layout):
    """Save with GPT-NeoX's scaler (raises at the minimum, window 1000, hysteresis 2) holding
    this run's counters; load it as a resume does (`CheckpointIO._engine_load`)."""
    import torch
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    from megatron.training.checkpoint.checkpoint_io import CheckpointIO

    mine = engine.optimizer.loss_scaler
    neox = DynamicLossScaler(init_scale=mine.cur_scale, scale_window=1000, min_scale=1,
                             delayed_shift=2, consecutive_hysteresis=False,
                             raise_error_at_min_scale=True, dtype=torch.half)  # fmt: skip
    neox.cur_iter, neox.last_overflow_iter = mine.cur_iter, mine.last_overflow_iter
    neox.cur_hysteresis = mine.cur_hysteresis
    engine.optimizer.loss_scaler = neox
    engine.save_checkpoint(str(folder / "neox"), tag="step")
    again, _ = _engine(folder / "neox_again", layout)
    io = CheckpointIO(again, save_dir=None)
    io._engine_load(str(folder / "neox"), "step", load_optim=True, module_only=False)
    got = again.optimizer.loss_scaler
    return {name: getattr(got, name) for name in (
        "cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis", "scale_window",
        "min_scale", "delayed_shift", "raise_error_at_min_scale")} | {
        "counters": (neox.cur_scale, neox.cur_iter, neox.last_overflow_iter, neox.cur_hysteresis)
    }  # fmt: skip


def _scaling_of_every_engine(rank, world_size, folder):
    from megatron.training.step.fp16_scaler import HYSTERESIS_STATE_KEY
    from megatron.training.step.steps import engine_steps

    _allow_fp16_on_cpu()
    out = {}
    for layout in LAYOUTS:
        engine, topology = _engine(folder / layout, layout)
        scaler = engine.optimizer.loss_scaler
        out[layout] = {
            "initial": float(engine.optimizer.loss_scale),
            "scales": _drive(engine, STEPS),
            "hysteresis_saved": engine.optimizer.state_dict().get(HYSTERESIS_STATE_KEY),
            "left": scaler.cur_hysteresis,
        }
        if layout == "plain_zero0":  # the scaler's state survives a checkpoint
            engine.save_checkpoint(str(folder / "ckpt"))
            again, _ = _engine(folder / "again", layout)
            again.load_checkpoint(str(folder / "ckpt"))
            out[layout]["resumed"] = (float(again.optimizer.loss_scale),
                                      again.optimizer.loss_scaler.cur_hysteresis)  # fmt: skip
        if layout == "plain_zero1":  # a checkpoint whose scaler GPT-NeoX built
            out[layout]["neox_resume"] = _resume_from_a_neox_scaler(engine, folder, layout)
        # On a fresh engine, a real step at a scale no fp16 gradient survives overflows only
        # if the loss is scaled in backward; then one that fits, its gradient norm unscaled.
        engine, topology = _engine(folder / f"{layout}_train", layout)
        steps = engine_steps(engine, topology)
        engine.optimizer.loss_scale = 2.0**40
        steps.train_step(_batches(2))
        huge_applied = steps.step_applied
        engine.optimizer.loss_scale = 2.0**8
        loss = steps.train_step(_batches(2))
        out[layout].update(huge_applied=huge_applied, fit_applied=steps.step_applied,
                           loss=loss, norm=float(engine.get_global_grad_norm()))  # fmt: skip
    return out


def test_every_fp16_engine_follows_the_configured_dynamic_loss_scaling(tmp_path):
    results = run_distributed(_scaling_of_every_engine, 1, tmp_path, timeout=900)[0]
    expected = _expected_scales(STEPS)
    assert expected[:4] == [1024, 512, 256, 256]  # hysteresis 2 absorbs the first overflow
    for layout, r in results.items():
        assert r["initial"] == 2.0 ** FP16["initial_scale_power"], layout
        assert r["scales"] == expected, layout
        assert not r["huge_applied"] and r["fit_applied"], layout
    zero0 = results["plain_zero0"]
    assert zero0["hysteresis_saved"] == zero0["left"] == 1  # checkpointed with the optimizer
    assert zero0["resumed"] == (expected[-1], zero0["left"])
    # A resumed ZeRO run keeps the checkpoint's scale and counters and this config's rule
    neox = results["plain_zero1"]["neox_resume"]
    counters = (neox["cur_scale"], neox["cur_iter"], neox["last_overflow_iter"],
                neox["cur_hysteresis"])  # fmt: skip
    assert counters == neox["counters"] and neox["cur_scale"] == expected[-1]
    assert (neox["scale_window"], neox["min_scale"], neox["delayed_shift"]) == (
        FP16["loss_scale_window"],
        FP16["min_loss_scale"],
        FP16["hysteresis"],
    )
    assert neox["raise_error_at_min_scale"] is False
    for layout in ("pipeline_zero0", "plain_zero1", "plain_zero3"):  # the same step
        assert results[layout]["loss"] == pytest.approx(zero0["loss"], rel=1e-3)
        assert results[layout]["norm"] == pytest.approx(zero0["norm"], rel=2e-2)
