"""Metrics loggers, one file each: console, metrics.jsonl, TensorBoard, wandb, Comet (rank 0
only).

loggers = build_loggers(cfg, rank, train_iters)
loggers.log_train(record); loggers.log_eval(record); loggers.close()
"""

from __future__ import annotations

import torch

from megatron.training.metrics.loggers.base import TRAIN_KEYS, LoggerGroup, MetricsLogger, scalars
from megatron.training.metrics.loggers.console import ConsoleLogger, format_train_line
from megatron.training.metrics.loggers.jsonl import JsonlLogger


def build_loggers(cfg, rank: int, train_iters: int | None = None) -> LoggerGroup:
    """The loggers `cfg.logging` asks for on global rank 0; an empty group elsewhere. The
    console's TFLOP/s are per GPU, or per rank on a machine without one (the ranks' device)."""
    if rank != 0:
        return LoggerGroup([])
    log = cfg.logging
    device = "GPU" if torch.cuda.is_available() else "rank"
    loggers: list[MetricsLogger] = [ConsoleLogger(train_iters, device=device)]
    if log.log_dir:
        loggers.append(JsonlLogger(log.log_dir))
    if log.tensorboard_dir:
        from megatron.training.metrics.loggers.tensorboard import TensorBoardLogger

        loggers.append(TensorBoardLogger(log.tensorboard_dir))
    if log.use_wandb:
        from megatron.training.metrics.loggers.wandb_logger import WandbLogger

        loggers.append(
            WandbLogger(
                log.wandb_project,
                group=log.wandb_group,
                entity=log.wandb_team,
                name=log.wandb_run_name,
                host=log.wandb_host,
                run_dir=log.log_dir,
                config=cfg.to_dict() if hasattr(cfg, "to_dict") else None,
            )
        )
    if log.use_comet:
        from megatron.training.metrics.loggers.comet_logger import CometLogger

        loggers.append(
            CometLogger(
                workspace=log.comet_workspace,
                project=log.comet_project,
                name=log.comet_experiment_name,
                tags=log.comet_tags,
                others=log.comet_others,
                config=cfg.to_dict() if hasattr(cfg, "to_dict") else None,
            )
        )
    return LoggerGroup(loggers)


__all__ = [
    "TRAIN_KEYS",
    "ConsoleLogger",
    "JsonlLogger",
    "LoggerGroup",
    "MetricsLogger",
    "build_loggers",
    "format_train_line",
    "scalars",
]
