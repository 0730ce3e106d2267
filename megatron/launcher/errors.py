"""The launcher's error type: every message names the key, file or variable and what is valid."""

from __future__ import annotations


class LauncherError(ValueError):
    """A launcher setting, hostfile or worker environment that cannot work as given.

    Subclasses `ValueError` so config validation code can treat it like any other bad value.
    """


class HostfileError(LauncherError):
    """A hostfile that is missing or malformed; the message names the file and the line."""


class WorkerEnvironmentError(LauncherError):
    """A worker cannot find its rank, world size or master address in its environment."""
