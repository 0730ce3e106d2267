"""The logger interface and the record every logger receives.

A training record is one dict per log interval with the keys of `TRAIN_KEYS` (the contract of
`metrics.jsonl`, see docs/architecture.md); optional figures (`eta_s`, `time/*` timers,
`max_memory_allocated_gib` on a GPU: the peak the process's allocator has held since it began,
`grad_norm/*` and `param_norm/*` per parameter) may be added. An evaluation record is
`{"iteration", "split", "loss", "perplexity"}` with `split` "valid" or "test". A run's start
record (`log_run`, see `megatron/training/metrics/report.py::run_start_record`) has `split`
"run". Scalar names for TensorBoard and wandb are `"{split}/{key}"` (`train/loss`,
`valid/perplexity`), the same in both.
"""

from __future__ import annotations

from typing import Any

TRAIN_KEYS = (
    "iteration",
    "loss",
    "lr",
    "grad_norm",
    "loss_scale",
    "skipped",
    "tokens_per_sec",
    "tflops_per_gpu",
    "mfu",
    "elapsed_s",
)


def scalars(record: dict[str, Any], split: str) -> dict[str, float]:
    """The numeric entries of a record as `{"{split}/{key}": value}` (None values dropped;
    inf/NaN kept, so a diverged loss shows in TensorBoard and wandb)."""
    out = {}
    for key, value in record.items():
        if key in ("iteration", "split") or value is None or isinstance(value, bool | str):
            continue
        if isinstance(value, int | float):
            out[f"{split}/{key}"] = float(value)
    return out


class MetricsLogger:
    """One destination for metrics (console, file, TensorBoard, wandb)."""

    def log_train(self, record: dict[str, Any]) -> None:
        """A training record (see the module docstring)."""

    def log_eval(self, record: dict[str, Any]) -> None:
        """An evaluation record (see the module docstring)."""

    def log_text(self, text: str) -> None:
        """A free-form message (start-up report, notices)."""

    def log_run(self, record: dict[str, Any]) -> None:
        """The start of a run (a file that several runs append to needs it; see `jsonl.py`)."""

    def close(self) -> None:
        """Flush and release resources."""


class LoggerGroup(MetricsLogger):
    """Forwards every call to each of its loggers, in order."""

    def __init__(self, loggers: list[MetricsLogger]):
        self.loggers = list(loggers)

    def log_train(self, record):
        for logger in self.loggers:
            logger.log_train(record)

    def log_eval(self, record):
        for logger in self.loggers:
            logger.log_eval(record)

    def log_text(self, text):
        for logger in self.loggers:
            logger.log_text(text)

    def log_run(self, record):
        for logger in self.loggers:
            logger.log_run(record)

    def close(self):
        for logger in self.loggers:
            logger.close()
