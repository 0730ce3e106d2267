"""`wall_clock_breakdown` figures are the time really spent, whoever resets DeepSpeed's timers.

DeepSpeed's plain engine prints and resets its timers at every optimizer step; the training
record read them afterwards and logged 0.0 ms for everything (seen in an H200 run's log). The
checks drive DeepSpeed's own timer class the way its engines do."""

from __future__ import annotations

import time
from types import SimpleNamespace

from deepspeed.utils.timer import SynchronizedWallClockTimer

from megatron.training.loop.callbacks import EngineTimers


def timed(timers, name: str, seconds: float) -> None:
    timers(name).start()
    time.sleep(seconds)
    timers(name).stop()


def test_time_printed_and_reset_by_deepspeed_each_step_is_summed():
    timers = SynchronizedWallClockTimer()
    collected = EngineTimers(SimpleNamespace(timers=timers))
    for _ in range(2):  # two steps of the plain engine: each prints and resets "fwd"
        timed(timers, "fwd", 0.02)
        timers.log(["fwd"])
    assert timers("fwd").elapsed(reset=False) == 0.0  # what reading them alone used to see
    assert 38.0 <= collected.collect()["fwd"] < 200.0
    assert collected.collect() == {"fwd": 0.0}  # the next interval starts empty


def test_time_deepspeed_has_not_printed_is_read_at_collect():
    timers = SynchronizedWallClockTimer()
    collected = EngineTimers(SimpleNamespace(timers=timers))
    timed(timers, "train_batch", 0.02)  # the pipeline engine prints only every steps_per_print
    timers.log(["train_batch"], reset=False)
    timed(timers, "train_batch", 0.02)
    assert 38.0 <= collected.collect()["train_batch"] < 200.0


def test_an_engine_without_timers_gives_none():
    assert EngineTimers(SimpleNamespace()).collect() == {}
