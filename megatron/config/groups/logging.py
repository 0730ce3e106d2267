"""Logging, monitoring and profiling settings (`cfg.logging`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src


@dataclass(frozen=True)
class LoggingConfig:
    log_dir: str | None = None
    """Folder for `metrics.jsonl` and text logs."""

    tensorboard_dir: str | None = None
    """TensorBoard event folder (null disables TensorBoard)."""

    log_interval: int = 100
    """Report metrics every this many iterations."""

    steps_per_print: int = 10
    """DeepSpeed's own progress print interval, with `deepy.py --verbose` (our iteration line
    every `log_interval` says the same)."""

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

    use_comet: bool | None = None
    """Log to Comet when true (null, GPT-NeoX's default, is off). `comet_ml` reads its API key
    from `COMET_API_KEY` or `comet login`; `COMET_START_ONLINE=false` writes an offline archive
    to upload later."""

    comet_workspace: str | None = None
    """Comet workspace (null: the account's default workspace)."""

    comet_project: str | None = None
    """Comet project (null: Comet's Uncategorized Experiments)."""

    comet_experiment_name: str | None = None
    """Comet experiment name (null: a random one)."""

    comet_tags: list[str] | None = None
    """Tags attached to the Comet experiment."""

    comet_others: dict[str, Any] | None = None
    """Further metadata logged as the Comet experiment's "others"."""

    log_grad_norm: bool = False
    """Log the gradient norm of each parameter."""

    log_param_norm: bool = False
    """Log the norm of each parameter."""

    peak_theoretical_tflops: float | None = None
    """Peak TFLOP/s per device for MFU; default from a table of known GPUs."""

    profile: bool = False
    """Run the PyTorch profiler over iterations [`profile_step_start`, `profile_step_stop`) and
    write each rank's trace (TensorBoard's profiler plugin or Perfetto open it) to
    `{log_dir}/profile/rank{R}.iters{A}-{B}.pt.trace.json`."""

    profile_step_start: int = 10
    """First profiled iteration (iterations count from 1, as in the training log)."""

    profile_step_stop: int = 12
    """Iteration at which profiling stops (not profiled itself)."""

    memory_profiling: bool = False
    """Record memory over the profiled iterations into `memory_profiling_path`, per rank: on a
    GPU a CUDA allocator snapshot (`rank{R}.iters{A}-{B}.pickle`, for pytorch.org/memory_viz);
    on CPU a profiler trace with every allocation and free
    (`rank{R}.iters{A}-{B}.memory.pt.trace.json`, TensorBoard's memory view or Perfetto)."""

    memory_profiling_path: str | None = None
    """Folder of the `memory_profiling` output (required with it)."""


def validate_profiling(cfg, sources: dict[str, str]) -> None:
    """The profiled window must be a non-empty range of iterations with a folder to write to."""
    lg = cfg.logging
    if not (lg.profile or lg.memory_profiling):
        return
    start, stop = lg.profile_step_start, lg.profile_step_stop
    if start < 1 or stop <= start:
        raise ConfigError(
            f"profile_step_start {start} / profile_step_stop {stop}"
            f"{_src(sources, 'profile_step_start')}{_src(sources, 'profile_step_stop')}: "
            "profiling needs 1 <= profile_step_start < profile_step_stop (iterations count from "
            "1; the stop iteration is not profiled)"
        )
    if lg.profile and not lg.log_dir:
        raise ConfigError(
            f"profile: true{_src(sources, 'profile')} writes its traces to {{log_dir}}/profile/, "
            "but log_dir is not set; set log_dir"
        )
    if lg.memory_profiling and not lg.memory_profiling_path:
        raise ConfigError(
            f"memory_profiling: true{_src(sources, 'memory_profiling')} needs "
            "memory_profiling_path (the folder for the memory snapshots); set it"
        )
