"""Checkpoint save/load settings (`cfg.checkpointing`), and the parsing of `checkpoint_keep`.

When each kind of checkpoint is saved and which ones are deleted is
`megatron/training/checkpoint/policy.py`'s to say; this file holds the keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from megatron.config.schema import ConfigError


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
    """Delete older checkpoints of the `checkpoint_factor` schedule, keeping this many (null
    keeps all); permanent (`checkpoint_keep`) and temporary checkpoints neither count nor are
    deleted by it."""

    checkpoint_keep: list[dict[str, Any]] | None = None
    """Permanent checkpoints, never deleted (Levanter's `keep`): a list of `{every: N, until:
    M}` tiers, `until` inclusive, ascending, only the last may omit it (forever); e.g.
    `[{every: 1000, until: 10000}, {every: 5000}]`. Null: none."""

    checkpoint_save_interval_minutes: float | None = None
    """Temporary checkpoint when this many minutes passed since the last save of any kind
    (Levanter's `save_interval`); the previous temporary one is deleted once the next
    checkpoint of any kind is complete. Null: no time-based saves."""

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


@dataclass(frozen=True)
class CheckpointTier:
    """One `checkpoint_keep` entry: a permanent checkpoint every `every` iterations, up to and
    including iteration `until` (None: for the rest of the run)."""

    every: int
    until: int | None = None


def parse_checkpoint_keep(raw: list[dict[str, Any]] | None, where: str = "") -> tuple:
    """The tiers of `checkpoint_keep`, checked as Levanter checks its `keep` list: `every` a
    positive integer, `until` ascending, only the last tier without `until`."""
    tiers: list[CheckpointTier] = []
    for i, item in enumerate(raw or ()):
        name = f"checkpoint_keep[{i}]{where}"
        if not isinstance(item, dict) or "every" not in item or set(item) - {"every", "until"}:
            raise ConfigError(
                f"{name} is {item!r}; expected a mapping with 'every' (steps) and optionally "
                "'until' (a step), e.g. {every: 1000, until: 10000}"
            )
        every, until = item["every"], item.get("until")
        if not _positive_int(every):
            raise ConfigError(f"{name}: every {every!r} is not valid; expected an integer >= 1")
        if until is not None and not _positive_int(until):
            raise ConfigError(f"{name}: until {until!r} is not valid; expected an integer >= 1")
        if tiers and tiers[-1].until is None:
            raise ConfigError(
                f"{name} follows a tier without 'until' (which lasts forever); only the last "
                "tier may omit 'until'"
            )
        if tiers and until is not None and until <= tiers[-1].until:
            raise ConfigError(
                f"{name}: until {until} is not after the previous tier's until "
                f"{tiers[-1].until}; list the tiers in ascending order of 'until'"
            )
        tiers.append(CheckpointTier(every, until))
    return tuple(tiers)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
