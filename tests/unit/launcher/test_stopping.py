"""How deepy.py's stop goes from signal to report: which signals ask and which force, that the
ranks alone (launch.py's children) get the SIGTERM, once each, and what is said at the end. The
whole wait, signals and all, is in test_runner_process.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from megatron.launcher.failures import BUG, COLLATERAL, LOST_PEER, USER, Failure
from megatron.launcher.stopping import (
    FORCED,
    INTERRUPTED_EXIT,
    REQUESTED,
    RunCheckpoints,
    RunStopper,
    interrupt_report,
)

SAVES = RunCheckpoints(lambda: None, resumes=True)


def _stopper() -> tuple[RunStopper, list]:
    said: list = []
    return RunStopper(lambda state, signum: said.append((state, signum))), said


@pytest.mark.parametrize(
    "signals, state",
    [
        ([signal.SIGINT], REQUESTED),
        ([signal.SIGINT, signal.SIGINT], FORCED),
        ([signal.SIGTERM, signal.SIGTERM], REQUESTED),  # a scheduler's repeat does not force
        ([signal.SIGTERM, signal.SIGINT], FORCED),
        ([signal.SIGINT, signal.SIGINT, signal.SIGINT], FORCED),
    ],
)
def test_a_first_signal_asks_and_a_second_ctrl_c_forces(signals, state):
    stopper, said = _stopper()
    for signum in signals:
        stopper.interrupt(signum)
    assert stopper.state == state and said == []  # the handler says nothing itself
    stopper.follow()  # no runner yet: the stop is said, and waits for one
    states = [REQUESTED] if state == REQUESTED else [REQUESTED, FORCED]
    assert said == [(s, signals[0]) for s in states]
    stopper.follow()
    assert len(said) == len(states)  # each said once


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
TREE = f"""
import subprocess, sys, time
launch = subprocess.Popen([sys.executable, "-c", '''
import subprocess, sys, time
ranks = [subprocess.Popen({SLEEPER!r}) for _ in range(2)]
print(" ".join(str(r.pid) for r in ranks), flush=True)
time.sleep(60)
''', "deepspeed.launcher.launch"], stdout=sys.stdout)
other = subprocess.Popen({SLEEPER!r})
launch.wait()
"""


def test_only_the_children_of_launch_py_are_told_once(tmp_path):
    runner = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        ranks = {int(pid) for pid in runner.stdout.readline().split()}
        stopper, _ = _stopper()
        stopper.attach(runner.pid)
        stopper.interrupt(signal.SIGINT)
        stopper.follow()
        stopper.follow()  # told once: a rank saving does not hear it again
        deadline = time.monotonic() + 30
        while {p.pid for p in stopper.left()} & ranks:  # the sleepers die of the SIGTERM
            assert time.monotonic() < deadline, "the ranks were not stopped"
            time.sleep(0.05)
        assert len(stopper.seen) == 4  # launch.py, 2 ranks, the runner's other child
        assert len(stopper.left()) == 2 and runner.poll() is None  # those two untouched
        stopper.interrupt(signal.SIGINT)
        stopper.follow()
        assert runner.wait(timeout=30) == -signal.SIGKILL
        while stopper.left():
            assert time.monotonic() < deadline, f"left: {stopper.left()}"
            time.sleep(0.05)
    finally:
        runner.kill()
        runner.wait()


def _failure(kind: str, error: str) -> Failure:
    return Failure(0, kind, error, "message", "")


@pytest.mark.parametrize(
    "stop, status, failures, before, after, checkpoints, said, code",
    [
        (REQUESTED, 0, [], None, "global_step7", SAVES,
         "interrupted: saved global_step7; the same command resumes from it", 0),
        (REQUESTED, 0, [], "global_step4", "global_step7",
         RunCheckpoints(lambda: None, resumes=False), "interrupted: saved global_step7", 0),
        (REQUESTED, 0, [], None, None, None,
         "interrupted: the ranks stopped (nothing saved: the config sets no `save`)", 0),
        (REQUESTED, 241, [], "global_step4", "global_step4", SAVES,
         "interrupted: the ranks stopped before saving (runner exit status 241); "
         "`latest` still names global_step4", INTERRUPTED_EXIT),
        (REQUESTED, 2, [_failure(USER, LOST_PEER), _failure(COLLATERAL, "RuntimeError")],
         None, None, SAVES,
         "interrupted: the ranks stopped before saving (runner exit status 2)",
         INTERRUPTED_EXIT),
        (FORCED, -9, [], "global_step4", "global_step4", SAVES,
         "stopped at once, without saving; `latest` still names global_step4", INTERRUPTED_EXIT),
        (FORCED, -9, [], None, None, None, "stopped at once, without saving", INTERRUPTED_EXIT),
    ],
)  # fmt: skip
def test_what_a_stop_says(stop, status, failures, before, after, checkpoints, said, code):
    assert interrupt_report(stop, status, failures, before, after, checkpoints) == ([said], code)


@pytest.mark.parametrize("kind", [USER, BUG])
def test_a_rank_that_failed_on_its_own_during_the_stop_is_reported_as_a_failure(kind):
    failures = [_failure(kind, "CheckpointSaveError"), _failure(USER, LOST_PEER)]
    assert interrupt_report(REQUESTED, 2, failures, None, None, SAVES) is None
