"""SIGTERM/SIGINT: finish the current iteration, save a checkpoint and exit cleanly."""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist


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
        flag = torch.tensor([1 if self.received is not None else 0], dtype=torch.int32)
        if dist.is_initialized() and dist.get_world_size() > 1:
            if dist.get_backend() == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
