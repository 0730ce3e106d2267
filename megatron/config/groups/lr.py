"""Learning-rate schedule settings (`cfg.lr`) and the iterations they derive.

Without cycle keys the schedule is GPT-NeoX's `AnnealingLR`. `lr_cycles` / `lr_cycle_length`
split the decay iterations into Levanter's cycles ({[(re)warm-up] -> [stable] -> [decay]} per
cycle); `lr_cycle_ends` and `lr_cycle_phases` turn the keys into iterations, refusing what
cannot be honoured.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

from megatron.config.schema import ConfigError, derived


@dataclass(frozen=True)
class LRConfig:
    lr_decay_style: Literal[
        "constant", "linear", "cosine", "exponential", "inverse_sqrt", "wsd", "inv"
    ] = "linear"
    """Shape of the decay after warm-up; `wsd` is warm-up-stable-decay; `inv` is Levanter's
    inverse decay, peak / (1 + (peak / min_lr - 1) × t / T), which needs min_lr > 0."""

    lr_decay_iters: int | None = None
    """Iterations over which the LR decays; default `lr_decay_fraction` × train_iters, or
    train_iters."""

    lr_decay_fraction: float | None = None
    """Decay over this fraction of the training iterations (instead of `lr_decay_iters`)."""

    warmup: float = 0.01
    """Warm-up length. Up to 1 (`1` and `1.0` alike) a fraction of the decay iterations, as
    GPT-NeoX (always a fraction) and Levanter (a fraction up to 1) read it: `warmup: 1` warms
    up over the whole decay. Above 1 a whole number of iterations, as in Levanter (so one
    warm-up iteration is the fraction 1 / decay iterations). Without LR cycles the fraction is
    not rounded (GPT-NeoX); with them it is a fraction of the first cycle, rounded down."""

    min_lr: float = 0.0
    """Floor of the learning rate after warm-up (GPT-NeoX: every style is clipped at it; a
    linear decay reaches it before the end). Within LR cycles a linear decay ends at it, as in
    Levanter (min_lr_ratio × the learning rate)."""

    wsd_decay_fraction: float = 0.1
    """For `wsd`: fraction of the decay iterations (with cycles: of each cycle) spent in the
    final decay."""

    wsd_decay_style: Literal["linear", "cosine", "exponential", "inverse_sqrt"] = "linear"
    """For `wsd`: shape of the final decay from the peak to `min_lr` (Megatron-LM's shapes;
    `exponential` is its `2 · 0.5^q - 1` over the decay's progress q, `inverse_sqrt` its
    `minus_sqrt`, `1 - sqrt(q)`)."""

    lr_cycles: int | list[int] | None = None
    """Levanter's `cycles`: the number of LR cycles (of equal length) over the decay
    iterations, or the iterations where cycles end (the last cycle ends with the decay
    iterations). Each cycle re-warms (`lr_rewarmup`), holds the peak, then decays with
    `lr_decay_style`. Not with `lr_cycle_length`."""

    lr_cycle_length: int | float | list[int] | None = None
    """Levanter's `cycle_length`: the length of every LR cycle (a fraction of the decay
    iterations when <= 1, else iterations; a remainder joins the last cycle), or a list of
    cycle lengths (a remainder makes one more cycle). Not with `lr_cycles`."""

    lr_rewarmup: float = 0.0
    """Levanter's `rewarmup`: LR cycles after the first climb linearly from the previous
    cycle's final LR back to the peak over this fraction of the cycle (when <= 1) or this many
    iterations; 0 jumps straight back to the peak."""

    lr_cycle_decay: float | None = None
    """Levanter's `decay`: iterations of each LR cycle spent decaying (a fraction of the cycle
    when <= 1, else iterations); the rest after the (re)warm-up holds the peak. Default: all of
    the cycle after its (re)warm-up (no stable phase)."""

    override_lr_scheduler: bool = False
    """On resume, use the schedule settings of the config, not those in the checkpoint."""

    use_checkpoint_lr_scheduler: bool = False
    """On resume, use the schedule settings stored in the checkpoint."""

    warmup_iters: float = derived(0.0)
    """Warm-up iterations (derived from `warmup`; fractional, as in GPT-NeoX; with LR cycles,
    whole iterations of the first cycle)."""

    decay_iters: int = derived(0)
    """Decay iterations (derived)."""

    @property
    def cycled(self) -> bool:
        return self.lr_cycles is not None or self.lr_cycle_length is not None


def decay_and_warmup_iters(lr: LRConfig, train_iters: int | None) -> tuple[int, float]:
    """GPT-NeoX's decay length and warm-up: `lr_decay_iters`, else
    floor(`lr_decay_fraction` × train_iters), else train_iters, at least 1; the warm-up is
    `warmup` × decay iterations for a `warmup` up to 1, not rounded (NeoX keeps the fraction),
    else `warmup` iterations. (0, 0.0) while the run length is unknown (`train_epochs`: known
    only once the data is read). With LR cycles the warm-up belongs to the first cycle
    (Levanter: rounded down), and the cycles are checked."""
    check_cycle_keys(lr)
    check_frac_or_steps("warmup", lr.warmup, "the decay iterations (with LR cycles: of cycle 1)")
    if lr.lr_decay_iters is not None:
        decay = lr.lr_decay_iters
    elif not train_iters:
        return 0, 0.0
    elif lr.lr_decay_fraction is not None:
        decay = math.floor(train_iters * lr.lr_decay_fraction)
    else:
        decay = train_iters
    decay = max(1, int(decay))
    ends = lr_cycle_ends(lr, decay, train_iters)
    if not ends:
        return decay, lr.warmup * decay if lr.warmup <= 1 else float(lr.warmup)
    first = frac_or_steps("warmup", lr.warmup, ends[0])
    lr_cycle_phases(ends, first, lr.lr_rewarmup, lr.lr_cycle_decay)  # refuse now, not at run time
    return decay, float(first)


def check_cycle_keys(lr: LRConfig) -> None:
    """Refuse cycle keys that contradict each other or the decay style (no run length
    needed)."""
    if lr.lr_cycles is not None and lr.lr_cycle_length is not None:
        raise ConfigError(
            f"lr_cycles ({lr.lr_cycles!r}) and lr_cycle_length ({lr.lr_cycle_length!r}) are "
            "both set; set one of them (Levanter refuses both too)"
        )
    if not lr.cycled:
        for key, unset in (("lr_rewarmup", 0.0), ("lr_cycle_decay", None)):
            if getattr(lr, key) != unset:
                raise ConfigError(
                    f"{key} {getattr(lr, key)!r} applies to LR cycles, and neither lr_cycles "
                    "nor lr_cycle_length is set (lr_cycles: 1 for a single cycle)"
                )
        return
    if lr.lr_decay_style == "inverse_sqrt":
        raise ConfigError(
            "lr_decay_style 'inverse_sqrt' has no end, so it cannot decay within LR cycles "
            "(lr_cycles / lr_cycle_length); use linear, cosine, exponential, constant, wsd or inv"
        )
    if lr.lr_decay_style == "wsd" and lr.lr_cycle_decay is not None:
        raise ConfigError(
            "lr_cycle_decay and lr_decay_style 'wsd' both set the stable phase of an LR cycle; "
            "use wsd_decay_fraction with wsd, or lr_cycle_decay with another style"
        )


def check_frac_or_steps(key: str, value: float, of: str = "the cycle") -> None:
    """Refuse a value that is neither a fraction (of `of`) in [0, 1] nor whole iterations."""
    if value < 0 or (value > 1 and value % 1):
        raise ConfigError(
            f"{key} {value!r} is not valid; give a fraction of {of} in [0, 1] or a whole "
            "number of iterations above 1"
        )


def frac_or_steps(key: str, value: float, length: int) -> int:
    """Levanter's reading of a cycle key: up to 1 a fraction of `length` (rounded down), above
    1 a whole number of iterations."""
    check_frac_or_steps(key, value)
    return int(value * length) if value <= 1 else int(value)


# Where the iterations the cycles divide come from (GPT-NeoX's decay length).
_SPAN = "lr_decay_iters, else lr_decay_fraction × train_iters, else train_iters"


def lr_cycle_ends(lr: LRConfig, span: int, train_iters: int | None = None) -> tuple[int, ...]:
    """Levanter's cycle boundaries over the `span` decay iterations: the iteration at which
    each cycle ends, the last one `span`; () without cycle keys."""
    check_cycle_keys(lr)
    if not lr.cycled:
        return ()
    cycles, length = lr.lr_cycles, lr.lr_cycle_length
    if isinstance(length, list | tuple):
        if min(length, default=0) < 1:
            raise ConfigError(f"lr_cycle_length {list(length)}: give positive cycle lengths")
        ends = list(itertools.accumulate(length))
        _check_listed_ends("lr_cycle_length (summed)", ends, span, train_iters)
    elif length is not None:
        every = frac_or_steps("lr_cycle_length", length, span)
        if not 1 <= every <= span:
            raise ConfigError(
                f"lr_cycle_length {length!r} gives cycles of {every} iterations; the LR "
                f"schedule spans {span} ({_SPAN}), so give 1 to {span} iterations"
            )
        ends = [i * every for i in range(1, span // every)]
    elif isinstance(cycles, list | tuple):
        ends = list(cycles)
        _check_listed_ends("lr_cycles", ends, span, train_iters)
    else:
        if not 1 <= cycles <= span:
            raise ConfigError(f"lr_cycles {cycles} must be between 1 and {span} ({_SPAN})")
        ends = [int(span / cycles * (i + 1)) for i in range(cycles - 1)]
    if not ends or ends[-1] != span:
        ends.append(span)
    return tuple(ends)


def _check_listed_ends(key: str, ends: list[int], span: int, train_iters: int | None) -> None:
    if any(b <= a for a, b in zip([0, *ends], ends, strict=False)):
        raise ConfigError(f"{key} {ends}: cycle ends must be increasing iterations above 0")
    if train_iters and ends[-1] > train_iters:
        raise ConfigError(
            f"{key} ends a cycle at iteration {ends[-1]}, beyond train_iters {train_iters}"
        )
    if ends[-1] > span:
        raise ConfigError(
            f"{key} ends a cycle at iteration {ends[-1]}, beyond the {span} iterations the LR "
            f"schedule spans ({_SPAN}); end the cycles by {span} or raise lr_decay_iters"
        )


@dataclass(frozen=True)
class CyclePhases:
    """One LR cycle, iterations [start, end): (re)warm-up, stable at the peak, decay."""

    start: int
    end: int
    warmup: int
    stable: int
    decay: int


def lr_cycle_phases(
    ends: tuple[int, ...], first_warmup: int, rewarmup: float, decay: float | None
) -> tuple[CyclePhases, ...]:
    """Levanter's phases of each cycle: the first warms up over `first_warmup` iterations, the
    others over `rewarmup` of theirs; the decay takes `decay` of the cycle, by default all of it
    after the (re)warm-up; the stable phase is what remains."""
    phases, start = [], 0
    for index, end in enumerate(ends):
        length = end - start
        key = "warmup" if index == 0 else "lr_rewarmup"
        warm = first_warmup if index == 0 else frac_or_steps(key, rewarmup, length)
        fall = length - warm if decay is None else frac_or_steps("lr_cycle_decay", decay, length)
        if decay is not None and fall < 1:  # Levanter holds the peak, or refuses (cosine)
            raise ConfigError(
                f"lr_cycle_decay {decay!r} gives LR cycle {index + 1} (iterations {start} to "
                f"{end}) no iteration to decay in: it would drop from the peak to min_lr at "
                "once; give the decay a fraction of the cycle or iterations > 0, or use "
                "lr_decay_style: constant to hold the peak"
            )
        if warm > length or warm + fall > length:
            parts = f"{key} ({warm})" + ("" if decay is None else f" plus lr_cycle_decay ({fall})")
            raise ConfigError(
                f"LR cycle {index + 1} (iterations {start} to {end}) is {length} iterations "
                f"long, shorter than its {parts}; shorten them or lengthen the cycle "
                "(lr_cycles / lr_cycle_length)"
            )
        phases.append(CyclePhases(start, end, warm, length - warm - fall, fall))
        start = end
    return tuple(phases)
