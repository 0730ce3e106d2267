"""The vocabulary of the pre-flight: a `Finding` per result, the levels, and the registry of
checks (`register`, `CHECKS`) that each check module fills on import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from megatron.config import Config, ConfigError

ERROR, WARNING, OK = "error", "warning", "ok"


@dataclass(frozen=True)
class Finding:
    """One result of one check: `level` is ERROR (refuse), WARNING (go on) or OK (report)."""

    check: str
    level: str
    message: str

    def line(self) -> str:
        return f"[{self.level}] {self.check}: {self.message}"


class PreflightError(ConfigError):
    """One or more pre-flight checks failed; the message lists every failure."""


CheckFn = Callable[[Config, str], list[Finding]]


@dataclass(frozen=True)
class Check:
    """A registered check: `reads_worker_files` checks are skipped by `preflight_shared_fs`."""

    name: str
    run: CheckFn
    reads_worker_files: bool


CHECKS: list[Check] = []


def register(name: str, *, reads_worker_files: bool) -> Callable[[CheckFn], CheckFn]:
    """Decorator adding a check to `CHECKS` (run in registration order)."""

    def add(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(name, fn, reads_worker_files))
        return fn

    return add
