"""Comet (`use_comet`): the same scalars as TensorBoard and wandb (`train/loss`,
`valid/perplexity`), at step = iteration.

`comet_ml.start` reads the API key and the mode from Comet's own settings (`COMET_API_KEY`,
`comet login`; `COMET_START_ONLINE=false` and `COMET_OFFLINE_DIRECTORY` write an offline
archive that `comet upload` sends later), so no secret passes through the config.
"""

from __future__ import annotations

from megatron.launcher.optional_packages import MissingPackageError
from megatron.training.metrics.loggers.base import MetricsLogger, scalars


class CometLogger(MetricsLogger):
    """One Comet experiment with the run's resolved config as its parameters."""

    def __init__(
        self,
        *,
        workspace: str | None = None,
        project: str | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        others: dict | None = None,
        config: dict | None = None,
    ):
        try:
            import comet_ml
        except ImportError as err:
            raise MissingPackageError(
                "use_comet is true but the comet_ml package is missing: pip install comet_ml, "
                "or set use_comet: false"
            ) from err
        # Comet's capture of stdout would interleave with the console logger's lines, and its
        # automatic metrics would add figures the other trackers do not have.
        settings = comet_ml.ExperimentConfig(
            name=name,
            tags=list(tags) if tags else None,
            auto_output_logging=False,
            auto_metric_logging=False,
            auto_param_logging=False,
            display_summary_level=0,
        )
        self.experiment = comet_ml.start(
            workspace=workspace, project=project, experiment_config=settings
        )
        if config:
            self.experiment.log_parameters(config)
        if others:
            self.experiment.log_others(others)

    def log_train(self, record):
        self.experiment.log_metrics(scalars(record, "train"), step=record["iteration"])

    def log_eval(self, record):
        self.experiment.log_metrics(scalars(record, record["split"]), step=record["iteration"])

    def log_text(self, text):
        self.experiment.log_text(text)

    def close(self):
        self.experiment.end()
