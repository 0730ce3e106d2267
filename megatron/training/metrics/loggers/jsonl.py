"""`{log_dir}/metrics.jsonl`: one JSON object per training log interval and per evaluation.

An inf/NaN figure (a diverged loss, an overflowing gradient norm) is written as `NaN`,
`Infinity` or `-Infinity`, as Python's `json` writes and reads them, never as `null`: a
diverging run must not look like one with a missing figure.
"""

from __future__ import annotations

import json
from pathlib import Path

from megatron.training.metrics.loggers.base import MetricsLogger

FILENAME = "metrics.jsonl"


class JsonlLogger(MetricsLogger):
    """Appends records to `{log_dir}/metrics.jsonl` (a resumed run keeps appending)."""

    def __init__(self, log_dir: str | Path):
        self.path = Path(log_dir) / FILENAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("a", encoding="utf-8")

    def _write(self, record) -> None:
        self.file.write(json.dumps(record, sort_keys=False, allow_nan=True) + "\n")
        self.file.flush()

    def log_train(self, record):
        self._write(record)

    def log_eval(self, record):
        self._write(record)

    def close(self):
        self.file.close()
