"""The LR within Levanter's cycles (`lr_cycles` / `lr_cycle_length`), as a pure function of
the iteration.

The decay iterations are split into cycles at `ScheduleSettings.cycle_ends`; the phases of each
cycle come from `megatron.config.groups.lr.lr_cycle_phases`. With k = iterations into a cycle that
warms up over w, holds the peak for s and decays over d:

    k < w          first cycle: peak × max(1, k) / w       (GPT-NeoX's warm-up, see below)
                   later: previous + (peak - previous) × k / w (previous: the previous cycle's
                                                                final LR)
    k < w + s      peak
    otherwise      max(min_lr, shape(min(k - w - s, d), d))

`shape` is the `lr_decay_style` of `styles.DECAY_STYLES` (its `in_cycle`), evaluated as
if the cycle's decay were a whole decay of d iterations after a warm-up of w (so `wsd` decays
over the last `wsd_decay_fraction` of the cycle). It is GPT-NeoX's shape except for `linear`,
which is Levanter's: from the peak to `min_lr` at the end of the decay, not clipped at it
before. A cycle's LR at its end is its final LR, and it
holds past the last cycle (Levanter's schedules stop their clock). With a re-warm-up of 0 the
first iteration of a cycle is back at the peak.

Levanter's first warm-up starts at 0 (optax's linear schedule at count 0), which spends the
first step of training at LR 0; like the schedule without cycles it uses GPT-NeoX's current
warm-up instead, whose first step already has the LR of the second.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import replace

from megatron.config.groups.lr import CyclePhases, lr_cycle_phases
from megatron.training.optim.lr.settings import ScheduleSettings
from megatron.training.optim.lr.styles import warmup_lr

Shape = Callable[["ScheduleSettings"], float]


def phases_of(s: ScheduleSettings) -> tuple[CyclePhases, ...]:
    return lr_cycle_phases(s.cycle_ends, int(s.warmup_iters), s.rewarmup, s.cycle_decay)


def cycle_lr(s: ScheduleSettings, shape: Shape) -> float:
    """The LR after `s.num_iters` applied steps of a cycled schedule."""
    phases = phases_of(s)
    index = min(bisect.bisect_right(s.cycle_ends, s.num_iters), len(phases) - 1)
    p = phases[index]
    k = s.num_iters - p.start
    if k < p.warmup and index == 0:
        return warmup_lr(s.peak_lr, k, p.warmup)
    if k < p.warmup:
        before = _decayed(phases[index - 1], phases[index - 1].decay, s, shape)
        return before + (s.peak_lr - before) * k / p.warmup
    if k < p.warmup + p.stable:
        return float(s.peak_lr)
    return _decayed(p, min(k - p.warmup - p.stable, p.decay), s, shape)


def _decayed(p: CyclePhases, into: int, s: ScheduleSettings, shape: Shape) -> float:
    """The LR `into` iterations into the decay of cycle `p`, floored at `min_lr`."""
    local = replace(
        s, num_iters=p.warmup + into, warmup_iters=p.warmup, decay_iters=p.warmup + p.decay,
        cycle_ends=(),
    )  # fmt: skip
    return max(shape(local), s.min_lr)
