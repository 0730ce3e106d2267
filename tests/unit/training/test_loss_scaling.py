"""The skipped-step guard (the engine's fp16 loss scaling is tested on the engines the trainer
builds, in `test_fp16_engine_scaling.py`)."""

from __future__ import annotations

import pytest

from megatron.training.step.loss_scaling import SkippedStepGuard, TooManySkippedSteps


def test_guard_stops_the_run_after_consecutive_skips():
    guard = SkippedStepGuard(3)
    for it, applied in enumerate([False, False, True, False, False]):
        guard.update(applied, it)
    assert (guard.consecutive, guard.total) == (2, 4)
    with pytest.raises(TooManySkippedSteps, match="last 3 optimizer steps.*loss scale now 4"):
        guard.update(False, 5, loss_scale=4.0)
    with pytest.raises(ValueError, match="max_consecutive_skipped_steps"):
        SkippedStepGuard(0)
