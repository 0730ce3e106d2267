"""Lock files of torch's extension builder: found before launch, and never waited on silently.

torch builds an extension (a DeepSpeed op the install did not build, `deepspeed_ops.py`) under
`TORCH_EXTENSIONS_DIR` (default `~/.cache/torch_extensions/py311_cpu/...`), one folder per
extension, holding `<folder>/lock` while it builds: the builder creates the file and keeps it
open, and every other process waits, polling, until the file is gone. A build killed half way
(Ctrl-C, a time limit, a scheduler) leaves the file, and every later run on the machine waits
forever, with no message and no CPU.

* `lock_findings` (the pre-flight, `megatron/preflight/build_locks.py`): every lock under the
  extensions folder, with the processes of this machine that hold it open. A lock nobody
  holds is certainly stale when the launch runs on this machine alone (a builder would be one
  of its processes), or when it is older than `STALE_AFTER` (no build takes that long); it is
  then removed. Otherwise (a build may run on another node sharing the folder) it is reported.
* `watch_lock_waits` (every worker): a process that waits on a lock says so after
  `WAIT_NOTICE` seconds, naming the file, and again every few minutes.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

STALE_AFTER = 30 * 60  # seconds: a lock this old with no holder here is a killed build's
WAIT_NOTICE = 60.0  # seconds of waiting on a lock before a worker says so
LOCK_NAME = "lock"


def extensions_root() -> Path:
    """Where torch builds extensions: `TORCH_EXTENSIONS_DIR`, else its per-user cache."""
    chosen = os.environ.get("TORCH_EXTENSIONS_DIR")
    if chosen:
        return Path(chosen)
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def find_locks(root: Path) -> list[Path]:
    """The build locks under `root` (`<root>/<ext>/lock`, or one level deeper for torch's
    `py311_cpu/<ext>/lock`)."""
    if not root.is_dir():
        return []
    return sorted(p for p in [*root.glob(f"*/{LOCK_NAME}"), *root.glob(f"*/*/{LOCK_NAME}")])


def holders(path: Path) -> list[int]:
    """PIDs of this machine's processes that have `path` open (the builder keeps it open)."""
    target = os.path.realpath(path)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.path.realpath(fd) == target:
                    found.append(int(proc.name))
                    break
        except OSError:  # gone, or not ours to read
            continue
    return found


@dataclass(frozen=True)
class LockState:
    path: Path
    age: float
    holders: tuple[int, ...]
    removed: bool


def lock_findings(root: Path, *, one_machine: bool, now: float | None = None) -> list[LockState]:
    """Every lock under `root`, the stale ones removed (module docstring)."""
    now = time.time() if now is None else now
    states = []
    for path in find_locks(root):
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:  # released meanwhile
            continue
        held = tuple(holders(path))
        stale = not held and (one_machine or age > STALE_AFTER)
        if stale:
            path.unlink(missing_ok=True)
        states.append(LockState(path, age, held, stale))
    return states


def watch_lock_waits(notice_after: float = WAIT_NOTICE) -> None:
    """Make torch's lock wait (`FileBaton.wait`) log the file it waits on after `notice_after`
    seconds, then every five minutes; it still waits as before."""
    from torch.utils import file_baton

    baton = file_baton.FileBaton
    if getattr(baton.wait, "megatron_watched", False):
        return

    def wait(self) -> None:
        started = time.monotonic()
        next_notice = notice_after
        while os.path.exists(self.lock_file_path):
            time.sleep(self.wait_seconds)
            waited = time.monotonic() - started
            if waited >= next_notice:
                logger.warning(
                    "waiting %.0f s for the build lock %s: another process is compiling this "
                    "extension; if none is (a killed build), remove the file",
                    waited,
                    self.lock_file_path,
                )
                next_notice += 300.0

    wait.megatron_watched = True
    baton.wait = wait
