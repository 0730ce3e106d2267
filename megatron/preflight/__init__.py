"""Pre-flight: what `deepy.py` checks on the launching machine before any worker starts.

    findings = run_preflight(cfg, "train.py")   # every check, all findings, nothing launched
    raise_on_errors(findings)                   # PreflightError listing every failed check

Each check is a function `check(cfg, script) -> list[Finding]` registered in `CHECKS` with
whether it reads files the workers will read (datasets, tokenizer files, the checkpoint in
`load`, the `save` folder). On a multi-node cluster the launching node may not see the file
system the workers see; `preflight_shared_fs: false` skips those checks and says so. A check
reports every problem it finds (not just the first), so one launch attempt shows them all.
"""

from __future__ import annotations

from megatron.config import Config
from megatron.preflight.findings import (
    CHECKS,
    ERROR,
    OK,
    WARNING,
    Check,
    Finding,
    PreflightError,
    register,
)

__all__ = [
    "CHECKS",
    "ERROR",
    "OK",
    "WARNING",
    "Check",
    "Finding",
    "PreflightError",
    "raise_on_errors",
    "register",
    "run_preflight",
]


def run_preflight(cfg: Config, script: str, *, shared_fs: bool = True) -> list[Finding]:
    """Run every registered check; file checks are skipped (and said so) without `shared_fs`."""
    _load_checks()
    findings: list[Finding] = []
    for check in CHECKS:
        if check.reads_worker_files and not shared_fs:
            findings.append(Finding(check.name, WARNING, "skipped (preflight_shared_fs: false)"))
            continue
        findings.extend(check.run(cfg, script))
    return findings


def raise_on_errors(findings: list[Finding]) -> None:
    """Raise PreflightError naming every failed check, or return if none failed."""
    errors = [f for f in findings if f.level == ERROR]
    if errors:
        lines = "\n".join(f"  - {f.check}: {f.message}" for f in errors)
        raise PreflightError(f"pre-flight found {len(errors)} problem(s):\n{lines}")


def _load_checks() -> None:
    """Import the check modules once; each registers its checks on import."""
    from megatron.preflight import checks  # noqa: F401
