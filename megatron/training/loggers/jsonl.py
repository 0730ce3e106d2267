"""`{log_dir}/metrics.jsonl`: one JSON object per training log interval and per evaluation."""

from __future__ import annotations

import json
import math
from pathlib import Path

from megatron.training.loggers.base import MetricsLogger

FILENAME = "metrics.jsonl"


def _clean(value):
    """JSON has no inf/nan: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlLogger(MetricsLogger):
    """Appends records to `{log_dir}/metrics.jsonl` (a resumed run keeps appending)."""

    def __init__(self, log_dir: str | Path):
        self.path = Path(log_dir) / FILENAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("a", encoding="utf-8")

    def _write(self, record) -> None:
        clean = {k: _clean(v) for k, v in record.items()}
        self.file.write(json.dumps(clean, sort_keys=False) + "\n")
        self.file.flush()

    def log_train(self, record):
        self._write(record)

    def log_eval(self, record):
        self._write(record)

    def close(self):
        self.file.close()
