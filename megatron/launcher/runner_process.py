"""deepy.py's wait for DeepSpeed's runner: quiet remote launchers, and no orphaned run on a stop.

    status = run_runner(argv, env, quiet_remote=True)

* Under pdsh, every node runs DeepSpeed's `launch.py` at its default INFO level (the runner
  passes its own `--log_level` to a local launch.py only), which prints the environment it
  exports and each worker's whole command line, config bundle included (and, at ERROR, a
  failed worker's, which deepy.py reports itself). With `quiet_remote`, those lines
  (`NODE: [time] [INFO|ERROR] [launch.py:...]`) are dropped from the runner's output;
  everything else passes through line by line, on the stream it came on.
* A SIGTERM to deepy.py (`kill`, SLURM cancelling the job) is passed on to the runner, and
  deepy.py keeps waiting for it instead of dying first: the launch's files are then removed
  once the runner is gone (a killed deepy.py left its hostfile and errors folder behind).
  SIGINT (Ctrl-C) reaches the runner from the terminal itself; deepy.py waits for it too.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

REMOTE_LAUNCHER_INFO = re.compile(
    rb"^[\w.@-]+: \[[^\]]*\] \[(INFO|ERROR)\] \[launch\.py:\d+:\w+\] "
)


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
