"""deepy.py's wait for DeepSpeed's runner: quiet remote launchers, and no orphaned run on a stop.

    status = run_runner(argv, env, quiet_remote=True)        # a multi-node launch
    ended = run_local_runner(argv, env, announce)            # the ranks run on this machine

* Under pdsh, every node runs DeepSpeed's `launch.py` at its default INFO level (the runner
  passes its own `--log_level` to a local launch.py only), which prints the environment it
  exports and each worker's whole command line, config bundle included (and, at ERROR, a
  failed worker's, which deepy.py reports itself). With `quiet_remote`, those lines
  (`NODE: [time] [INFO|ERROR] [launch.py:...]`) are dropped from the runner's output;
  everything else passes through line by line, on the stream it came on.
* A multi-node launch: a SIGTERM to deepy.py (`kill`, SLURM cancelling the job) is passed on to
  the runner, and deepy.py keeps waiting for it instead of dying first: the launch's files are
  then removed once the runner is gone (a killed deepy.py left its hostfile and errors folder
  behind). SIGINT (Ctrl-C) reaches the runner from the terminal itself; deepy.py waits for it.
* A launch whose ranks run here (`run_local_runner`): the runner starts with SIGINT and SIGTERM
  blocked, for it and its launch.py (each rank unblocks SIGTERM), and deepy.py alone stops the
  run on a Ctrl-C or a SIGTERM, to it or to the whole process group
  (megatron/launcher/stopping.py); `RunnerEnd` says how it ended.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from megatron.launcher.stopping import REQUESTED, RUNNER_BLOCKED, RunStopper

REMOTE_LAUNCHER_INFO = re.compile(
    rb"^[\w.@-]+: \[[^\]]*\] \[(INFO|ERROR)\] \[launch\.py:\d+:\w+\] "
)
FOLLOW_S = 0.2  # how often the wait looks at a stop, and at the run's processes after one
QUIET_WAIT_S = 2.0  # how long processes outliving the runner are waited for without a word


def run_runner(argv: list[str], env: dict[str, str], *, quiet_remote: bool = False) -> int:
    """Run the runner to its end (module docstring); return its exit status."""
    pipe = subprocess.PIPE if quiet_remote else None
    proc = subprocess.Popen(argv, env=env, stdout=pipe, stderr=pipe)
    copiers = []
    if quiet_remote:
        for source, target in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            copier = threading.Thread(target=_copy_lines, args=(source, target), daemon=True)
            copier.start()
            copiers.append(copier)
    with _passed_on(proc):
        status = proc.wait()
    for copier in copiers:
        copier.join()
    return status


def _copy_lines(source, target) -> None:
    """Copy `source` (bytes) to `target` (text) line by line, leaving out remote INFO lines."""
    out = target.buffer if hasattr(target, "buffer") else None
    for line in iter(source.readline, b""):
        if REMOTE_LAUNCHER_INFO.match(line):
            continue
        if out is not None:
            out.write(line)
        else:
            target.write(line.decode(errors="replace"))
        target.flush()
    source.close()


@contextmanager
def _passed_on(proc: subprocess.Popen) -> Iterator[None]:
    """While the block runs: SIGTERM is sent on to `proc`, SIGINT waits for it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def terminate(signum, frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, terminate),
        signal.SIGINT: signal.signal(signal.SIGINT, lambda signum, frame: None),
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclass(frozen=True)
class RunnerEnd:
    """How a local launch ended."""

    status: int
    """The runner's exit status."""
    stop: str | None
    """None (not stopped), `stopping.REQUESTED` (the ranks were asked to save and stop) or
    `stopping.FORCED` (a second Ctrl-C killed the run)."""


def run_local_runner(
    argv: list[str], env: dict[str, str] | None, announce: Callable[[str, int], None]
) -> RunnerEnd:
    """Run the runner of a launch whose ranks run on this machine to its end, and after a stop
    every process of the run (module docstring); `announce(state, signum)` as a stop goes."""
    stopper = RunStopper(announce)
    with _stop_signals(stopper) as handled:
        with _stops_blocked(handled):  # inherited: the runner and launch.py act on neither
            proc = subprocess.Popen(argv, env=env)
        stopper.attach(proc.pid)
        status = _wait(proc, stopper)
        _wait_for_the_rest(stopper)
    return RunnerEnd(status, stopper.state)


def _wait(proc: subprocess.Popen, stopper: RunStopper) -> int:
    while True:
        try:
            return proc.wait(timeout=FOLLOW_S)
        except subprocess.TimeoutExpired:
            stopper.follow()


def _wait_for_the_rest(stopper: RunStopper) -> None:
    """After a stop, once the runner is gone: wait for the ranks still running (saving; said
    on the console after `QUIET_WAIT_S`; a second Ctrl-C kills them), then kill what is left
    of the run (a loader worker or launch.py outliving them)."""
    stopper.follow()
    say_at = time.monotonic() + QUIET_WAIT_S
    while ranks := stopper.ranks():
        if say_at and time.monotonic() > say_at and stopper.state == REQUESTED:
            pids = ", ".join(str(p.pid) for p in ranks)
            line = f"waiting for {len(ranks)} rank(s) to save and exit (pid {pids}"
            print(f"deepy.py: {line}; Ctrl-C stops them at once)", file=sys.stderr, flush=True)
            say_at = None
        time.sleep(FOLLOW_S)
        stopper.follow()
    while stopper.left():
        stopper.kill_left()
        time.sleep(0.05)
        stopper.follow()


@contextmanager
def _stops_blocked(block: bool) -> Iterator[None]:
    """With `block`, SIGINT and SIGTERM blocked in this thread for the block: a process started
    in it inherits the mask (a signal that comes meanwhile waits for the handler in place
    after)."""
    if not block:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, RUNNER_BLOCKED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextmanager
def _stop_signals(stopper: RunStopper) -> Iterator[bool]:
    """While the block runs: SIGINT and SIGTERM go to `stopper.interrupt`. Yields whether they
    do: handlers can only be set from the main thread (elsewhere a Ctrl-C is left as it was)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    handler = lambda signum, frame: stopper.interrupt(signum)  # noqa: E731
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield True
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
