"""SIGTERM/SIGINT: finish the current iteration, save a checkpoint and exit cleanly."""

from __future__ import annotations

import signal

from megatron.parallel.host_values import reduce_host, world_group


class StopRequest:
    """Remembers a SIGTERM/SIGINT instead of dying mid-step; a second SIGINT interrupts."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None
        self._previous = {}

    def install(self) -> StopRequest:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def agreed(self) -> bool:
        """True on every rank when any rank received a signal (collective)."""
        return bool(reduce_host([self.received is not None], world_group(), op="max")[0])
