"""Pre-flight check of torch's extension build locks (`megatron/kernels/build_locks.py`).

A lock that no process holds is removed when it is certainly stale (this launch runs on this
machine alone, or the lock is older than any build), and reported as done; a lock held by a
live build is a warning (the workers will wait for it); one that may belong to a build on
another node sharing the folder refuses the launch, naming the file and how to clear it,
instead of letting every rank wait on it forever.
"""

from __future__ import annotations

from megatron.config import Config
from megatron.kernels.build_locks import extensions_root, lock_findings
from megatron.preflight.findings import ERROR, OK, WARNING, Finding, register

NAME = "build locks"


def _one_machine(cfg: Config) -> bool:
    launcher = cfg.launcher
    return launcher.launcher == "pdsh" and launcher.hostfile is None and not launcher.no_ssh


@register(NAME, reads_worker_files=True)
def check_build_locks(cfg: Config, script: str) -> list[Finding]:
    root = extensions_root()
    findings = []
    for lock in lock_findings(root, one_machine=_one_machine(cfg)):
        age = f"{lock.age / 60:.0f} min old"
        if lock.removed:
            why = "this launch runs here" if _one_machine(cfg) else age
            findings.append(
                Finding(NAME, OK, f"removed the stale build lock {lock.path} (no process "
                        f"holds it and {why}: a build was killed half way)")
            )  # fmt: skip
        elif lock.holders:
            pids = ", ".join(map(str, lock.holders))
            findings.append(
                Finding(NAME, WARNING, f"{lock.path}: process {pids} is compiling this "
                        "extension; the workers wait until it is done")
            )  # fmt: skip
        else:
            findings.append(
                Finding(NAME, ERROR, f"{lock.path} ({age}) is held by no process on this "
                        "machine: a build on another node sharing this folder, or one killed "
                        f"half way, on which every rank would wait; when no build runs, "
                        f"remove it (rm {lock.path})")
            )  # fmt: skip
    return findings or [Finding(NAME, OK, f"no build lock under {root}")]
