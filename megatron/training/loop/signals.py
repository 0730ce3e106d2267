"""SIGTERM/SIGINT: finish the current iteration, save a checkpoint and exit cleanly.

Under deepy.py on one machine a rank never sees the terminal's Ctrl-C: SIGINT stays blocked in
it (inherited from deepy.py, which blocks SIGTERM too for DeepSpeed's launcher; `run_worker`
takes SIGTERM back), and deepy.py passes the stop on as one SIGTERM
(megatron/launcher/stopping.py), so nothing interrupts a save. A SIGINT that reaches a rank
otherwise (a launcher that forwards it) is remembered like a SIGTERM; a second one raises
KeyboardInterrupt there.

Whether any rank received a signal is agreed over the world after every step. The non-finite
step check's all-reduce, which every rank runs before each optimizer step, carries the flag
(`megatron/training/step/nonfinite.py`), so the agreement costs no collective and no host read
of its own (`docs/performance.md`); without that check it is a host all-reduce of its own.

Other per-step host flags that every rank must agree on ride on the same all-reduce: `ride`
adds one (an object with `local() -> bool`, this rank's value, and `carried(agreed)`, the
world's MAX, as `StopRequest` itself has); `flags()` lists them for the check."""

from __future__ import annotations

import signal

from megatron.parallel.host_values import reduce_host, world_group


class StopRequest:
    """Remembers a SIGTERM/SIGINT instead of dying mid-step; a second SIGINT interrupts."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None
        self._previous = {}
        self._agreed: bool | None = None  # the world's answer, carried by this step's check
        self._riders: list = []  # further flags on the same all-reduce (`ride`)

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

    def ride(self, flag) -> None:
        """Let `flag` (`local()`, `carried(agreed)`) be agreed by the check that carries ours."""
        self._riders.append(flag)

    def flags(self) -> list:
        """What the carrying check all-reduces (MAX) and hands back, in order: this request,
        then the riders."""
        return [self, *self._riders]

    def local(self) -> bool:
        """This rank's flag: whether it received a signal."""
        return self.received is not None

    def carried(self, agreed: bool) -> None:
        """The world's answer, agreed by a collective that every rank ran this step."""
        self._agreed = agreed

    def agreed(self) -> bool:
        """True on every rank when any rank received a signal (collective, unless this step's
        check carried the answer)."""
        if self._agreed is not None:
            agreed, self._agreed = self._agreed, None
            return agreed
        return bool(reduce_host([self.received is not None], world_group(), op="max")[0])
