"""Weights & Biases (`use_wandb`); `WANDB_MODE=offline` logs locally without a network."""

from __future__ import annotations

from megatron.launcher.optional_packages import MissingPackageError
from megatron.training.metrics.loggers.base import MetricsLogger, scalars


class WandbLogger(MetricsLogger):
    """One wandb run; scalars named like TensorBoard's (`train/loss`, `valid/perplexity`)."""

    def __init__(
        self,
        project: str,
        *,
        group: str | None = None,
        entity: str | None = None,
        name: str | None = None,
        host: str | None = None,
        run_dir: str | None = None,
        config: dict | None = None,
    ):
        try:
            import wandb
        except ImportError as err:
            raise MissingPackageError(
                "use_wandb is true but the wandb package is missing: pip install wandb, or "
                "set use_wandb: false"
            ) from err
        if host:
            wandb.login(host=host, anonymous="allow")
        self.wandb = wandb
        self.run = wandb.init(
            project=project, group=group, entity=entity, name=name, dir=run_dir, config=config
        )

    def log_train(self, record):
        self.run.log(scalars(record, "train"), step=record["iteration"])

    def log_eval(self, record):
        self.run.log(scalars(record, record["split"]), step=record["iteration"])

    def close(self):
        self.run.finish()
