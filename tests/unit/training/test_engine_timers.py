"""`wall_clock_breakdown` figures are the time really spent, whoever resets DeepSpeed's timers,
and DeepSpeed prints them (`[Rank 0] time (ms) | ...`) only for a verbose worker.

DeepSpeed's plain engine prints and resets its timers at every optimizer step; the training
record read them afterwards and logged 0.0 ms for everything (seen in an H200 run's log). By
default those prints were on the console too, beside our iteration line, at every step. The
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


def two_plain_engine_steps(timers) -> None:
    for _ in range(2):  # each prints and resets "fwd"
        timed(timers, "fwd", 0.02)
        timers.log(["fwd"])


def test_time_printed_and_reset_by_deepspeed_each_step_is_summed(capsys):
    timers = SynchronizedWallClockTimer()
    collected = EngineTimers(SimpleNamespace(timers=timers), verbose=True)
    two_plain_engine_steps(timers)
    assert capsys.readouterr().out.count("time (ms) | fwd: ") == 2  # DeepSpeed's, as it was
    assert timers("fwd").elapsed(reset=False) == 0.0  # what reading them alone used to see
    assert 38.0 <= collected.collect()["fwd"] < 200.0
    assert collected.collect() == {"fwd": 0.0}  # the next interval starts empty


def test_a_quiet_worker_prints_none_and_records_all(capsys):
    timers = SynchronizedWallClockTimer()
    collected = EngineTimers(SimpleNamespace(timers=timers), verbose=False)
    two_plain_engine_steps(timers)
    assert capsys.readouterr().out == ""
    assert 38.0 <= collected.collect()["fwd"] < 200.0
    assert collected.collect() == {"fwd": 0.0}


def test_time_deepspeed_has_not_printed_is_read_at_collect():
    timers = SynchronizedWallClockTimer()
    collected = EngineTimers(SimpleNamespace(timers=timers), verbose=True)
    timed(timers, "train_batch", 0.02)  # the pipeline engine prints only every steps_per_print
    timers.log(["train_batch"], reset=False)
    timed(timers, "train_batch", 0.02)
    assert 38.0 <= collected.collect()["train_batch"] < 200.0


def test_an_engine_without_timers_gives_none():
    assert EngineTimers(SimpleNamespace(), verbose=False).collect() == {}
