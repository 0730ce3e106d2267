"""Logging and monitoring settings (`cfg.logging`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoggingConfig:
    log_dir: str | None = None
    """Folder for `metrics.jsonl` and text logs."""

    tensorboard_dir: str | None = None
    """TensorBoard event folder (null disables TensorBoard)."""

    log_interval: int = 100
    """Report metrics every this many iterations."""

    steps_per_print: int = 10
    """DeepSpeed's own progress print interval."""

    wall_clock_breakdown: bool = False
    """Time forward, backward, optimizer, data and pipeline communication separately."""

    use_wandb: bool = False
    """Log to Weights & Biases (`WANDB_MODE=offline` works without network)."""

    wandb_project: str = "neox"
    """wandb project."""

    wandb_group: str | None = None
    """wandb group (runs of one experiment)."""

    wandb_team: str | None = None
    """wandb entity."""

    wandb_host: str | None = None
    """wandb server address."""

    wandb_run_name: str | None = None
    """wandb run name."""

    log_grad_norm: bool = False
    """Log the gradient norm of each parameter."""

    log_param_norm: bool = False
    """Log the norm of each parameter."""

    peak_theoretical_tflops: float | None = None
    """Peak TFLOP/s per device for MFU; default from a table of known GPUs."""
