"""The head fused with the loss (`loss_chunk_tokens` > 0) on DeepSpeed's fp16 engine.

fp16 was refused for the fused path (its logits' gradient was cast to fp16 in the forward,
before the loss scale); now each chunk's gradient is lifted into fp16's range and both
gradients stay fp32 until the loss scale multiplies them (`chunked_cross_entropy.py`). On the
real fp16 engines the trainer builds (ZeRO 0, plain and pipeline; fp16 allowed on the CPU as
`test_fp16_engine_scaling.py` does), against the same engine writing full logits:

- the config is accepted and the loss scale is applied in the backward: every parameter's
  gradient (the fp16 weights' scaled gradients of one micro-batch, unscaled) within fp16
  rounding of the unfused engine's;
- a step at a loss scale no fp16 gradient survives overflows and is skipped, as the unfused
  engine's is: DeepSpeed's dynamic scaler sees it; a step at a scale that fits is applied,
  with the unfused engine's loss and gradient norm.
"""

from __future__ import annotations

import pytest

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings
from tests.unit.training.test_fp16_engine_scaling import _allow_fp16_on_cpu, _batches

pytestmark = pytest.mark.slow

FP16 = {"loss_scale": 0, "initial_scale_power": 12, "hysteresis": 1, "min_loss_scale": 1}
LAYOUTS = {"plain": dict(pipe_parallel_size=0), "pipeline": dict(pipe_parallel_size=1)}


def _engine(folder, layout, chunk):
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.engine import build_engine

    settings = tiny_settings(folder, hidden_dropout=0.0, attention_dropout=0.0, save=None,
                             load=None, checkpoint_factor=None, fp16=FP16,
                             loss_chunk_tokens=chunk, **LAYOUTS[layout])  # fmt: skip
    cfg = resolve(settings, 1)
    assert cfg.precision.dtype == "fp16" and cfg.model.loss_chunk_tokens == chunk
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    return build_engine(cfg, topology, cfg.training.train_iters).engine, topology


def _micro_batch_grads(engine):
    """One micro-batch's backward through the engine (its loss scale applied), unscaled."""
    (tokens, positions), labels = next(_batches(1))
    scale = float(engine.optimizer.loss_scale)
    engine.backward(engine.module.loss_fn(engine(tokens, positions), labels))
    grads = {n: p.grad.double() / scale for n, p in engine.module.named_parameters()}
    engine.optimizer.zero_grad()
    return grads


def _fused_and_unfused(rank, world_size, folder):
    from megatron.training.step.steps import engine_steps

    _allow_fp16_on_cpu()
    out = {}
    for layout in LAYOUTS:
        for chunk in (0, 16):
            engine, topology = _engine(folder / f"{layout}_{chunk}", layout, chunk)
            run = {"grads": _micro_batch_grads(engine) if layout == "plain" else None}
            steps = engine_steps(engine, topology)
            engine.optimizer.loss_scale = 2.0**40
            steps.train_step(_batches(2))
            run["huge_applied"] = steps.step_applied
            engine.optimizer.loss_scale = 2.0**12
            run["loss"] = steps.train_step(_batches(2))
            run["fit_applied"] = steps.step_applied
            run["norm"] = float(engine.get_global_grad_norm())
            out[(layout, chunk)] = run
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fused_fp16")
    return run_distributed(_fused_and_unfused, 1, folder, timeout=900)[0]


def test_fused_fp16_gradients_equal_the_unfused_fp16_engines(runs):
    ref, fused = runs[("plain", 0)]["grads"], runs[("plain", 16)]["grads"]
    assert set(fused) == set(ref)
    for name, grad in fused.items():
        assert grad.isfinite().all(), name
        error = (grad - ref[name]).norm() / ref[name].norm().clamp_min(1e-30)
        assert error <= 2.0**-8, f"gradient of {name}: {error:.2e}"  # measured: 9e-4


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fused_fp16_steps_overflow_and_apply_as_the_unfused_engines(runs, layout):
    ref, fused = runs[(layout, 0)], runs[(layout, 16)]
    assert not ref["huge_applied"] and not fused["huge_applied"]  # the scaler saw inf
    assert ref["fit_applied"] and fused["fit_applied"]
    assert fused["loss"] == pytest.approx(ref["loss"], rel=1e-3)
    assert fused["norm"] == pytest.approx(ref["norm"], rel=1e-2)
