"""Dynamic loss scaling with DeepSpeed's scaler built from our exported fp16 section."""

from __future__ import annotations

import pytest
import torch

from megatron.config import deepspeed_config
from megatron.training.loss_scaling import (
    SkippedStepGuard,
    TooManySkippedSteps,
    loss_scaler_from_deepspeed_config,
)

FP16 = {
    "loss_scale": 0,
    "initial_scale_power": 5,
    "loss_scale_window": 3,
    "hysteresis": 2,
    "min_loss_scale": 4,
}


@pytest.fixture(autouse=True)
def _deepspeed_comm(monkeypatch):
    """The scaler logs through deepspeed.comm's rank; one process, no process group."""
    from deepspeed import comm

    monkeypatch.setattr(comm, "get_rank", lambda *a, **k: 0)


def _scaler(make_config, **fp16):
    cfg = make_config(fp16={**FP16, **fp16})
    return loss_scaler_from_deepspeed_config(deepspeed_config(cfg))


def test_overflow_is_detected_on_inf_and_nan():
    # the check DeepSpeed's fp16 optimizers run on the gradients before each step
    from deepspeed.runtime.utils import CheckOverflow

    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))
    p.grad = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)
    check = CheckOverflow()
    assert not check.has_overflow_serial([p])
    for bad in (float("inf"), float("-inf"), float("nan")):
        p.grad[1] = bad
        assert check.has_overflow_serial([p])


def test_scale_halves_after_hysteresis_and_grows_back_after_window(make_config):
    scaler = _scaler(make_config)
    assert scaler.dynamic and scaler.loss_scale == 32  # 2 ** initial_scale_power
    scaler.update_scale(True)  # hysteresis 2: the first overflow only uses it up
    assert scaler.loss_scale == 32
    scaler.update_scale(True)
    assert scaler.loss_scale == 16
    scaler.update_scale(True)  # hysteresis stays spent until the scale grows again
    assert scaler.loss_scale == 8
    seen = []
    for _ in range(4):
        scaler.update_scale(False)
        seen.append(scaler.loss_scale)
    assert seen == [8, 8, 8, 16]  # grows after loss_scale_window = 3 clean steps


def test_scale_never_goes_below_min_loss_scale(make_config):
    scaler = _scaler(make_config, hysteresis=1)
    scaler.update_scale(True)
    scaler.update_scale(True)
    scaler.update_scale(True)
    assert scaler.loss_scale == 4  # 32 → 16 → 8 → 4 = min_loss_scale
    # DeepSpeed then gives up rather than looping at the floor
    with pytest.raises(Exception, match="minimum"):
        scaler.update_scale(True)


def test_static_scale_and_no_fp16(make_config):
    static = _scaler(make_config, loss_scale=128)
    assert not static.dynamic and static.loss_scale == 128
    fp32 = loss_scaler_from_deepspeed_config(deepspeed_config(make_config()))
    assert not fp32.dynamic and fp32.loss_scale == 1.0


def test_guard_stops_the_run_after_consecutive_skips():
    guard = SkippedStepGuard(3)
    for it, applied in enumerate([False, False, True, False, False]):
        guard.update(applied, it)
    assert (guard.consecutive, guard.total) == (2, 4)
    with pytest.raises(TooManySkippedSteps, match="last 3 optimizer steps.*loss scale now 4"):
        guard.update(False, 5, loss_scale=4.0)
    with pytest.raises(ValueError, match="max_consecutive_skipped_steps"):
        SkippedStepGuard(0)
