"""The console line of each log interval, with a progress bar on a terminal."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from megatron.training.metrics.loggers.base import MetricsLogger

BAR_WIDTH = 24


def format_duration(seconds: float | None) -> str:
    """`h:mm:ss` (or `-` when unknown)."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "-"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress_bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """`[#####.....]` for `done` of `total`."""
    filled = min(width, int(width * done / total)) if total else 0
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_train_line(record: dict[str, Any], train_iters: int | None, device: str = "GPU") -> str:
    """`iteration 20/600 | loss 4.1234 | lr 2.000E-03 | ...` from a training record.

    `device` names what the TFLOP/s are per (the record's `tflops_per_gpu`, divided by the
    world size): "GPU", or "rank" for CPU ranks, which are no GPU (and have no MFU)."""
    it = record["iteration"]
    total = f"/{train_iters}" if train_iters else ""
    parts = [
        f"iteration {it}{total}",
        f"loss {_num(record.get('loss'), '.4f')}",
        f"lr {_num(record.get('lr'), '.3E')}",
        f"grad norm {_num(record.get('grad_norm'), '.3f')}",
    ]
    if record.get("loss_scale") is not None:
        parts.append(f"loss scale {record['loss_scale']:g}")
    parts += [
        f"skipped {record.get('skipped', 0)}",
        f"{_num(record.get('tokens_per_sec'), ',.0f')} tokens/s",
        f"{_num(record.get('tflops_per_gpu'), '.3f')} TFLOP/s/{device}",
    ]
    if record.get("mfu") is not None:
        parts.append(f"MFU {100 * record['mfu']:.1f}%")
    parts.append(f"elapsed {format_duration(record.get('elapsed_s'))}")
    parts.append(f"ETA {format_duration(record.get('eta_s'))}")
    timers = {k[5:]: v for k, v in record.items() if k.startswith("time/") and v is not None}
    if timers:
        parts.append("ms: " + ", ".join(f"{k} {v:.1f}" for k, v in timers.items()))
    return " | ".join(parts)


class ConsoleLogger(MetricsLogger):
    """Writes one line per record; prefixes a progress bar when `stream` is a terminal.
    `device`: see `format_train_line`."""

    def __init__(
        self, train_iters: int | None = None, stream: TextIO | None = None, device: str = "GPU"
    ):
        self.train_iters = train_iters
        self.device = device
        self.stream = stream or sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def log_train(self, record):
        line = format_train_line(record, self.train_iters, self.device)
        if self.tty and self.train_iters:
            line = f"{progress_bar(record['iteration'], self.train_iters)} {line}"
        self._write(line)

    def log_eval(self, record):
        known = ("iteration", "split", "loss", "perplexity")
        extras = "".join(f" | {k} {v:.4f}" for k, v in record.items() if k not in known)
        ppl = f" | perplexity {record['perplexity']:.3f}" if "perplexity" in record else ""
        self._write(
            f"{record['split']} at iteration {record['iteration']} | loss "
            f"{record['loss']:.4f}{ppl}{extras}"
        )

    def log_text(self, text):
        self._write(text)
