"""`{log_dir}/metrics.jsonl`: one JSON object per training log interval and per evaluation,
after one that marks where each run starts.

Runs that share a `log_dir` append to one file: a resumed run continues its curve where the
interrupted one left it, in the file every plot and reader already looks at (a file per run,
as Lightning's versions, would split one curve over files and leave every reader to find and
join them). So each run first writes its start record, `{"split": "run", "iteration": the one
it starts at, 0 unless resumed, "resumed_from": the checkpoint folder or null, "run_id",
"start_time", "train_iters", "world_size", "config_files"}` (`report.py::run_start_record`).
`split` already tells records apart (absent for a training interval, "valid" or "test" for an
evaluation): every reader that takes a training record for one without `split` (the tests,
bench/gpu_check.py's `records()`) reads the file as before, and one that wants a run's records
takes those after its start record.

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

    def log_run(self, record):
        self._write(record)

    def close(self):
        self.file.close()
