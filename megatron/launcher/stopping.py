"""Ctrl-C on a launch whose ranks run on this machine: every rank saves and exits, and no
process of the run outlives deepy.py (the ranks' side is megatron/training/loop/signals.py).

A terminal's Ctrl-C sends SIGINT to its whole foreground process group: deepy.py, DeepSpeed's
runner, its launch.py and every rank at once; `timeout`, `kill -- -PGID`, systemd and a
scheduler's stop of every process of a job send SIGTERM the same way. Left to DeepSpeed 0.19.8,
the runner of a local launch has no handler (a KeyboardInterrupt traceback or exit status -15,
and it exits while launch.py goes on), and launch.py's handler SIGTERMs the ranks and SIGKILLs
any not gone 30 s later, saving or not: a step plus a save longer than that lost the save. So
`runner_process.run_local_runner` starts the runner with SIGINT and SIGTERM blocked
(`RUNNER_BLOCKED`), a mask that launch.py and the ranks inherit; each rank unblocks SIGTERM as
it starts (`take_sigterm`, called by `megatron/errors.py::run_worker`), and only deepy.py acts
on a Ctrl-C or a SIGTERM to the runner's side, through a `RunStopper`:

* the first Ctrl-C (or a SIGTERM to deepy.py): SIGTERM to every rank, the children of
  launch.py (a rank that starts later gets it as it appears); a training rank finishes its step,
  saves a checkpoint and exits 0, as on a scheduler's SIGTERM;
* a second Ctrl-C: SIGKILL to every process of the run, the runner included (`latest` still
  names the last complete checkpoint: it moves only once a save is whole).

After a stop, deepy.py notes every process of the run (the runner's descendants, also once
re-parented); once the runner has exited it waits for the ranks still saving, SIGKILLs what is
left (a loader worker that outlived its rank), and only then reports (`interrupt_report`).
Neither torch nor DeepSpeed is imported here (psutil is DeepSpeed's own dependency).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from megatron.launcher.failures import BUG, LOST_PEER, USER, Failure

LAUNCH_MODULE = "deepspeed.launcher.launch"  # the runner's local launcher; its children: ranks
REQUESTED, FORCED = "requested", "forced"
RUNNER_BLOCKED = frozenset({signal.SIGINT, signal.SIGTERM})  # blocked in the runner, launch.py
INTERRUPTED_EXIT = 130  # 128 + SIGINT: the shell's status for a job that Ctrl-C stopped


@dataclass(frozen=True)
class RunCheckpoints:
    """What deepy.py knows of a training run's checkpoints, for what a stop says."""

    latest: Callable[[], str | None]
    """Reads the tag `latest` names in the run's `save` folder now (None: none)."""
    resumes: bool
    """Whether the same command resumes from that folder (its `load` is the `save`)."""


class RunStopper:
    """Stops the run under one runner process (module docstring).

    A signal handler only calls `interrupt` (records the stop); the wait loop calls `follow`,
    which does the work and calls `announce(state, signum)` once per state reached, so the
    handler neither prints nor walks the process table."""

    def __init__(self, announce: Callable[[str, int], None]):
        self.announce = announce
        self.runner: psutil.Process | None = None
        self.state: str | None = None  # None, REQUESTED, FORCED
        self.signum: int | None = None  # the signal that asked for the stop
        self._pending: list[str] = []  # states reached, not announced yet
        self.seen: dict[int, psutil.Process] = {}  # every process of the run noted
        self._ranks: set[int] = set()  # pids found to be ranks (a rank stays one)
        self._told: set[int] = set()  # ranks sent SIGTERM

    def attach(self, pid: int) -> None:
        """The runner's process (before it, a stop waits: there is nothing to stop yet)."""
        self.runner = psutil.Process(pid)

    def interrupt(self, signum: int = signal.SIGINT) -> None:
        """A stop signal: the first asks the ranks to save and stop; a second SIGINT, at once."""
        if self.state is None:
            self.state, self.signum = REQUESTED, signum
            self._pending.append(REQUESTED)
        elif self.state == REQUESTED and signum == signal.SIGINT:
            self.state = FORCED
            self._pending.append(FORCED)

    def follow(self) -> None:
        """Act on the stop, if any: announce it, note the run's processes, then SIGTERM the
        ranks not told yet or, once forced, SIGKILL everything noted."""
        while self._pending:
            self.announce(self._pending.pop(0), self.signum or signal.SIGINT)
        if self.state is None or self.runner is None:
            return
        self._note()
        if self.state == FORCED:
            _send(self.runner, signal.SIGKILL)
            self.kill_left()
            return
        for proc in self.ranks():
            if proc.pid not in self._told:
                self._told.add(proc.pid)
                _send(proc, signal.SIGTERM)

    def ranks(self) -> list[psutil.Process]:
        """The ranks noted that still run: the children of a launch.py, once they run their
        own program (one forked but not yet executed would lose a signal with the fork)."""
        self._ranks.update(pid for pid, proc in self.seen.items() if _is_rank(proc))
        return [self.seen[pid] for pid in sorted(self._ranks) if _running(self.seen[pid])]

    def left(self) -> list[psutil.Process]:
        """The processes of the run noted so far that still run (the runner aside)."""
        return [p for pid, p in self.seen.items() if _running(p) and pid != self.runner.pid]

    def kill_left(self) -> None:
        """SIGKILL every process of the run noted that still runs (the runner aside)."""
        for proc in self.left():
            _send(proc, signal.SIGKILL)

    def _note(self) -> None:
        """Add the descendants of the runner and of every running process noted before."""
        roots = [p for p in [self.runner, *self.seen.values()] if _running(p)]
        children = _children_by_parent()
        queue = [p.pid for p in roots]
        while queue:
            for pid in children.get(queue.pop(), ()):
                if pid not in self.seen:
                    try:
                        self.seen[pid] = psutil.Process(pid)
                    except psutil.Error:  # gone already
                        continue
                    queue.append(pid)


def _is_rank(proc: psutil.Process) -> bool:
    try:
        parent = proc.parent()
        return (parent is not None and LAUNCH_MODULE in parent.cmdline()
                and LAUNCH_MODULE not in proc.cmdline())  # fmt: skip
    except psutil.Error:  # gone, or a zombie
        return False


def _children_by_parent() -> dict[int, list[int]]:
    """{pid: its children's pids} over the whole process table, read once."""
    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        children.setdefault(proc.info["ppid"], []).append(proc.pid)
    return children


def _running(proc: psutil.Process) -> bool:
    """Still running: not gone (nor its pid reused) and not a zombie waiting to be reaped."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _send(proc: psutil.Process, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except psutil.Error:  # gone meanwhile (psutil refuses a reused pid)
        pass


def take_sigterm() -> None:
    """A rank's first act: unblock SIGTERM, which it inherits blocked from a runner that deepy.py
    started (`RUNNER_BLOCKED`), so the SIGTERM that deepy.py sends it reaches its handler; SIGINT
    stays blocked. Nothing changes in a rank that a launcher started without that mask."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def announce_stop(state: str, signum: int, *, saves: bool) -> None:
    """Say on the console what a stop does, as it starts (`saves`: the run saves checkpoints)."""
    if state == FORCED:
        line = "interrupted again: stopping every process of the run at once, without saving"
    else:
        what = "saving a checkpoint after this step, then stopping" if saves else "stopping"
        again = " (Ctrl-C again stops at once, without saving)"
        line = f"SIGTERM: {what}" if signum == signal.SIGTERM else f"interrupted: {what}{again}"
    lead = "\n" if sys.stderr.isatty() else ""  # past the terminal's ^C
    print(f"{lead}deepy.py: {line}", file=sys.stderr, flush=True)


def interrupt_report(
    stop: str,
    status: int,
    failures: Sequence[Failure],
    before: str | None,
    after: str | None,
    checkpoints: RunCheckpoints | None,
) -> tuple[list[str], int] | None:
    """What deepy.py says after a stop, and its exit status; None: a rank failed on its own
    during the stop (a save that failed), whose failure report says it better.

    `status`: the runner's; `before`, `after`: the tag `latest` named at the launch and now;
    `checkpoints`: None when the run saves none. A rank that only lost its peer (one that the
    stop ended before it could save) failed because of the stop, not on its own. Exit status
    0 when the ranks stopped cleanly (as on a SIGTERM), else `INTERRUPTED_EXIT`."""
    kept = f"; `latest` still names {after}" if after else ""
    if stop == FORCED:
        return [f"stopped at once, without saving{kept}"], INTERRUPTED_EXIT
    if any(f.kind in (USER, BUG) and f.error != LOST_PEER for f in failures):
        return None
    if status != 0:
        reason = f"the ranks stopped before saving (runner exit status {status})"
        return [f"interrupted: {reason}{kept}"], INTERRUPTED_EXIT
    if after is not None and after != before:
        resume = "; the same command resumes from it" if checkpoints.resumes else ""
        return [f"interrupted: saved {after}{resume}"], 0
    unsaved = "nothing saved" if checkpoints else "nothing saved: the config sets no `save`"
    return [f"interrupted: the ranks stopped ({unsaved}){kept}"], 0
