"""What defines a learning-rate curve (`ScheduleSettings`), below the styles and cycles that
read it and the schedule that steps it.

The valid decay-style names are the config's (`megatron/config/groups/lr.py`'s `lr_decay_style` and
`wsd_decay_style` choices); `styles.py` holds one class per name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args, get_type_hints

from megatron.config.groups.lr import LRConfig

_CHOICES = get_type_hints(LRConfig)
DECAY_STYLE_NAMES = get_args(_CHOICES["lr_decay_style"])
WSD_TAIL_NAMES = get_args(_CHOICES["wsd_decay_style"])

# Settings that define the curve; on resume they are compared with the checkpoint's.
CURVE_KEYS = (
    "peak_lr", "min_lr", "warmup_iters", "decay_iters", "decay_style",
    "cycle_ends", "rewarmup", "cycle_decay",
)  # fmt: skip


@dataclass
class ScheduleSettings:
    """Everything `AnnealingLR` needs; `num_iters` is the run state (applied steps so far).
    `cycle_ends` (iterations where LR cycles end; () without cycles), `rewarmup` and
    `cycle_decay` are `cycles.py`'s."""

    peak_lr: float
    min_lr: float = 0.0
    warmup_iters: float = 0.0
    decay_iters: int = 0
    decay_style: str = "linear"
    wsd_decay_fraction: float = 0.1
    wsd_decay_style: str = "linear"
    num_iters: int = 0
    cycle_ends: tuple[int, ...] = ()
    rewarmup: float = 0.0
    cycle_decay: float | None = None

    def __post_init__(self):
        self.cycle_ends = tuple(int(e) for e in self.cycle_ends)
        if self.decay_style not in DECAY_STYLE_NAMES:
            raise ValueError(
                f"lr_decay_style '{self.decay_style}' is not valid; expected one of "
                f"{', '.join(DECAY_STYLE_NAMES)}"
            )
        if self.wsd_decay_style not in WSD_TAIL_NAMES:
            raise ValueError(
                f"wsd_decay_style '{self.wsd_decay_style}' is not valid; expected one of "
                f"{', '.join(WSD_TAIL_NAMES)}"
            )
        if self.warmup_iters < 0 or self.decay_iters < 0:
            raise ValueError(
                f"warm-up ({self.warmup_iters}) and decay ({self.decay_iters}) iterations must "
                "be >= 0; check warmup, lr_decay_iters and train_iters"
            )
        if not 0.0 <= self.wsd_decay_fraction <= 1.0:
            raise ValueError(f"wsd_decay_fraction {self.wsd_decay_fraction} must be in [0, 1]")
        if self.decay_style == "inv" and self.min_lr <= 0:
            raise ValueError(
                f"lr_decay_style 'inv' decays towards min_lr; min_lr {self.min_lr} must be > 0"
            )
