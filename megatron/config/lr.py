"""Learning-rate schedule settings (`cfg.lr`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from megatron.config.schema import derived


@dataclass(frozen=True)
class LRConfig:
    lr_decay_style: Literal[
        "constant", "linear", "cosine", "exponential", "inverse_sqrt", "wsd"
    ] = "linear"
    """Shape of the decay after warm-up; `wsd` is warm-up-stable-decay."""

    lr_decay_iters: int | None = None
    """Iterations over which the LR decays; default `lr_decay_fraction` × train_iters, or
    train_iters."""

    lr_decay_fraction: float | None = None
    """Decay over this fraction of the training iterations (instead of `lr_decay_iters`)."""

    warmup: float = 0.01
    """Warm-up length: a fraction of the decay iterations when below 1, else iterations."""

    min_lr: float = 0.0
    """Floor of the learning rate after warm-up (GPT-NeoX: every style is clipped at it; a
    linear decay reaches it before the end)."""

    wsd_decay_fraction: float = 0.1
    """For `wsd`: fraction of the decay iterations spent in the final decay."""

    wsd_decay_style: Literal["linear", "cosine", "exponential", "inverse_sqrt"] = "linear"
    """For `wsd`: shape of the final decay."""

    override_lr_scheduler: bool = False
    """On resume, use the schedule settings of the config, not those in the checkpoint."""

    use_checkpoint_lr_scheduler: bool = False
    """On resume, use the schedule settings stored in the checkpoint."""

    warmup_iters: float = derived(0.0)
    """Warm-up iterations (derived from `warmup`; fractional, as in GPT-NeoX)."""

    decay_iters: int = derived(0)
    """Decay iterations (derived)."""


def decay_and_warmup_iters(lr: LRConfig, train_iters: int | None) -> tuple[int, float]:
    """GPT-NeoX's decay length and warm-up: `lr_decay_iters`, else
    floor(`lr_decay_fraction` × train_iters), else train_iters, at least 1; the warm-up is
    `warmup` × decay iterations, not rounded (NeoX keeps the fraction). (0, 0.0) while the run
    length is unknown (`train_epochs`: known only once the data is read)."""
    if lr.lr_decay_iters is not None:
        decay = lr.lr_decay_iters
    elif not train_iters:
        return 0, 0.0
    elif lr.lr_decay_fraction is not None:
        decay = math.floor(train_iters * lr.lr_decay_fraction)
    else:
        decay = train_iters
    decay = max(1, int(decay))
    warmup = lr.warmup * decay if lr.warmup < 1 else float(int(lr.warmup))
    return decay, warmup
