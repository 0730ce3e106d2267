"""Checkpoint save/load settings (`cfg.checkpointing`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class CheckpointingConfig:
    save: str | None = None
    """Folder for checkpoints (`{save}/global_step{N}/`, `{save}/latest`)."""

    load: str | None = None
    """Folder to resume from (its `latest`); nothing to load is not an error."""

    checkpoint_factor: int | None = None
    """Save every this many iterations (linear), or the base of log-spaced saves."""

    checkpoint_scale: Literal["linear", "log"] = "linear"
    """`linear`: every `checkpoint_factor` steps; `log`: at powers of `checkpoint_factor`."""

    extra_save_iters: list[int] | None = None
    """Further iterations to save at."""

    keep_last_n_checkpoints: int | None = None
    """Delete older checkpoints, keeping this many (null keeps all)."""

    finetune: bool = False
    """Load model weights only: iteration, optimizer, scheduler and data position start fresh."""

    no_load_optim: bool = False
    """Do not load optimizer state."""

    no_load_rng: bool = False
    """Do not load RNG states."""

    no_save_optim: bool = False
    """Do not save optimizer state."""

    no_save_rng: bool = False
    """Do not save RNG states."""
