"""Learning-rate schedules: warm-up, then one of several decay shapes, floored at `min_lr`.

`AnnealingLR` is stepped by the DeepSpeed engine after every *applied* optimizer step (an
overflowing fp16 step is skipped and does not advance it), like GPT-NeoX's scheduler. With
n = `num_iters` completed steps, w = warm-up and D = decay iterations, the LR is

    warm-up (w > 0 and n <= w):  min(peak, peak × max(1, n) / w)
    otherwise:                   max(min_lr, shape(n - w, D - w))

The shapes of GPT-NeoX's `AnnealingLR` are computed as NeoX computes them, operation for
operation, so every iteration gives NeoX's value (its current warm-up, whose first step is
not 0, capped at the peak where NeoX's would exceed it, w < 1):

    constant     peak
    linear       peak × (D - w - (n - w)) / (D - w)                   (then clipped at min_lr)
    cosine       min_lr + (peak - min_lr) / 2 × (cos(π (n - w) / (D - w)) + 1)
    exponential  peak × exp(-0.693 (n - w) / (D - w))                 (halves over the decay)

NeoX does not stop the clock at D: past the decay, linear and exponential keep falling (so
sit at `min_lr`) and cosine climbs back towards the peak (its second half-period); set
`lr_decay_iters` >= train_iters to avoid that. When the warm-up covers the decay (D <= w,
possible with `warmup` given in iterations) the decay counts as finished.

Our own styles are classes in the same registry: `inverse_sqrt` (Megatron-LM), `wsd`
(warm-up, stable, decay), which holds the peak and decays over the last
`wsd_decay_fraction` × D iterations from the peak to `min_lr` with one of `WSD_TAILS`, and
Levanter's `inv`. With `lr_cycles` / `lr_cycle_length` the schedule is Levanter's cycles
(`cycles.py`), each decaying with these shapes, except that a linear decay runs from the
peak to `min_lr` over each cycle's decay (Levanter's) instead of being clipped at it.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from megatron.config.groups.lr import decay_and_warmup_iters, lr_cycle_ends
from megatron.training.optim.lr.cycles import cycle_lr
from megatron.training.optim.lr.settings import CURVE_KEYS, ScheduleSettings
from megatron.training.optim.lr.styles import DECAY_STYLES, warmup_lr


def lr_at(s: ScheduleSettings) -> float:
    """The learning rate after `s.num_iters` applied steps."""
    if s.cycle_ends:
        return cycle_lr(s, DECAY_STYLES[s.decay_style].in_cycle)
    if s.warmup_iters > 0 and s.num_iters <= s.warmup_iters:
        return warmup_lr(s.peak_lr, s.num_iters, s.warmup_iters)
    return max(DECAY_STYLES[s.decay_style].lr(s), s.min_lr)


_UNCYCLED = {"cycle_ends": (), "rewarmup": 0.0, "cycle_decay": None}


class AnnealingLR:
    """Sets the LR of every parameter group of `optimizer`; stepped after each applied step.

    `lr_scale` in a parameter group multiplies its LR (default 1). On resume,
    `override_lr_scheduler` keeps this run's curve and takes only the step count from the
    checkpoint; `use_checkpoint_lr_scheduler` takes the whole curve from the checkpoint; with
    neither, the curves must agree.
    """

    def __init__(
        self,
        optimizer,
        settings: ScheduleSettings,
        *,
        override_lr_scheduler: bool = False,
        use_checkpoint_lr_scheduler: bool = False,
    ):
        if override_lr_scheduler and use_checkpoint_lr_scheduler:
            raise ValueError(
                "override_lr_scheduler and use_checkpoint_lr_scheduler are both set; set at "
                "most one (override: this config's schedule; use_checkpoint: the checkpoint's)"
            )
        self.optimizer = optimizer
        self.settings = replace(settings)  # a copy: stepping must not change the caller's
        self.override = override_lr_scheduler
        self.use_checkpoint = use_checkpoint_lr_scheduler
        self._apply()

    @property
    def num_iters(self) -> int:
        return self.settings.num_iters

    def get_lr(self) -> float:
        return lr_at(self.settings)

    def get_last_lr(self) -> list[float]:
        """Per-group LRs (the name torch and DeepSpeed use)."""
        return [g["lr"] for g in self.optimizer.param_groups]

    def step(self, increment: int = 1) -> None:
        self.settings.num_iters += increment
        self._apply()

    def _apply(self) -> None:
        lr = self.get_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.settings)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.override:
            for key in CURVE_KEYS:
                # a checkpoint from before LR cycles lacks their keys: it had none
                ours, theirs = getattr(self.settings, key), state.get(key, _UNCYCLED.get(key))
                theirs = tuple(theirs) if key == "cycle_ends" else theirs
                if self.use_checkpoint:
                    setattr(self.settings, key, theirs)
                elif ours != theirs:
                    raise ValueError(
                        f"LR schedule '{key}' differs between this config ({ours!r}) and the "
                        f"checkpoint ({theirs!r}); set override_lr_scheduler: true to use this "
                        "config's schedule or use_checkpoint_lr_scheduler: true to use the "
                        "checkpoint's"
                    )
        self.settings.num_iters = int(state["num_iters"])
        self._apply()


def schedule_settings_from_config(cfg, train_iters: int | None = None) -> ScheduleSettings:
    """Settings from `cfg.lr` and `cfg.optimizer.lr`.

    `train_iters` gives the run length when it is only known at run time (`train_epochs`):
    when the config derived no decay length, decay and warm-up are derived from it by the
    same rule as at resolution (`decay_and_warmup_iters`); so are the LR cycles.
    """
    lr = cfg.lr
    decay, warmup = lr.decay_iters, lr.warmup_iters
    if train_iters is not None and not decay:
        decay, warmup = decay_and_warmup_iters(lr, train_iters)
    return ScheduleSettings(
        peak_lr=float(cfg.optimizer.lr),
        min_lr=float(lr.min_lr),
        warmup_iters=float(warmup),
        decay_iters=int(decay),
        decay_style=lr.lr_decay_style,
        wsd_decay_fraction=float(lr.wsd_decay_fraction),
        wsd_decay_style=lr.wsd_decay_style,
        cycle_ends=lr_cycle_ends(lr, int(decay), train_iters) if decay else (),
        rewarmup=float(lr.lr_rewarmup),
        cycle_decay=None if lr.lr_cycle_decay is None else float(lr.lr_cycle_decay),
    )


def build_lr_scheduler(cfg, optimizer, train_iters: int | None = None) -> AnnealingLR:
    """The scheduler of a run, for `deepspeed.initialize(lr_scheduler=...)`."""
    return AnnealingLR(
        optimizer,
        schedule_settings_from_config(cfg, train_iters),
        override_lr_scheduler=cfg.lr.override_lr_scheduler,
        use_checkpoint_lr_scheduler=cfg.lr.use_checkpoint_lr_scheduler,
    )
