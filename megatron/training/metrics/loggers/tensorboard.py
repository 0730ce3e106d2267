"""TensorBoard event files in `tensorboard_dir` (scalar names `train/loss`, `valid/loss`, ...).

A missing package is a `MissingPackageError`, a user error (its message alone on the console):
`deepy.py` refuses the config before launch when the launching machine lacks it, and this
catches a worker's Python that lacks it."""

from __future__ import annotations

from megatron.launcher.optional_packages import MissingPackageError
from megatron.training.metrics.loggers.base import MetricsLogger, scalars


class TensorBoardLogger(MetricsLogger):
    """Writes every numeric record entry as a scalar at step = iteration."""

    def __init__(self, tensorboard_dir: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise MissingPackageError(
                f"tensorboard_dir is set ({tensorboard_dir}) but the tensorboard package is "
                "missing: pip install tensorboard, or unset tensorboard_dir"
            ) from err
        self.writer = SummaryWriter(log_dir=tensorboard_dir)

    def _write(self, record, split):
        for tag, value in scalars(record, split).items():
            self.writer.add_scalar(tag, value, record["iteration"])
        self.writer.flush()

    def log_train(self, record):
        self._write(record, "train")

    def log_eval(self, record):
        self._write(record, record["split"])

    def log_text(self, text):
        self.writer.add_text("log", text)

    def close(self):
        self.writer.close()
