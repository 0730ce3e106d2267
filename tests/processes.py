"""Which processes of a test's run are still there: `session_left(sid)` scans /proc for the
processes of a session (a test starts its `deepy.py` with `start_new_session=True`, as a
terminal starts a job, so the session's id is that process's pid). Zombies have exited and
are left out."""

from __future__ import annotations

import os
from pathlib import Path


def session_left(sid: int) -> list[int]:
    """The pids of session `sid` still running."""
    left = []
    for pid in (int(name) for name in os.listdir("/proc") if name.isdigit()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state != "Z":
            left.append(pid)
    return left
