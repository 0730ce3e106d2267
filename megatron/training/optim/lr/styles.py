"""The decay shapes of `lr_decay_style` (and the final decays of `wsd`), one class each.

Each `DecayStyle.lr(s)` reads a `settings.ScheduleSettings`: n = `num_iters`, w =
`warmup_iters`, D = `decay_iters`, and returns the LR before the `min_lr` floor; the formulas
are listed in `schedule.py`'s docstring. `cycles.py` evaluates the same shapes within
each LR cycle through `DecayStyle.in_cycle`, which differs only where Levanter's shape does
(linear).
"""

from __future__ import annotations

import math

from megatron.training.optim.lr.settings import ScheduleSettings

LN2_NEOX = 0.693  # GPT-NeoX's exponential decay halves the LR over the decay: exp(-0.693 p)


def warmup_lr(peak: float, n: float, warmup: float) -> float:
    """GPT-NeoX's warm-up from 0 after `n` steps of `warmup`: peak × max(1, n) / warmup, so the
    first step (n = 0) already moves the weights and the second has the same LR. At most the
    peak: NeoX's formula gives peak / warmup > peak at n = 0 when the warm-up is shorter than
    one iteration (a `warmup` fraction times the decay iterations below 1)."""
    return min(float(peak), float(peak) * max(1, n) / warmup)


def _since_warmup(s: ScheduleSettings) -> tuple[float, float]:
    """(n - w, D - w): GPT-NeoX's iterations into the decay and decay length; (1, 1), a
    finished decay, when the warm-up covers it."""
    span = s.decay_iters - s.warmup_iters
    if span <= 0:
        return 1.0, 1.0
    return s.num_iters - s.warmup_iters, span


class DecayStyle:
    """One `lr_decay_style`: the LR after the warm-up, before the `min_lr` floor."""

    def lr(self, s: ScheduleSettings) -> float:
        raise NotImplementedError

    def in_cycle(self, s: ScheduleSettings) -> float:
        """The decay within an LR cycle (Levanter's), where it differs from GPT-NeoX's."""
        return self.lr(s)


class Constant(DecayStyle):
    """The peak LR throughout (after warm-up)."""

    def lr(self, s):
        return s.peak_lr


class Linear(DecayStyle):
    """GPT-NeoX: a line from the peak to 0 at the end of the decay, clipped at `min_lr` (so
    `min_lr` > 0 is reached before the end, not interpolated to). Within LR cycles Levanter's
    line (optax's linear schedule), from the peak to `min_lr` over the whole decay."""

    def lr(self, s):
        n, span = _since_warmup(s)
        return s.peak_lr * (span - n) / span

    def in_cycle(self, s):
        n, span = _since_warmup(s)
        return s.min_lr + (s.peak_lr - s.min_lr) * (span - n) / span


class Cosine(DecayStyle):
    """GPT-NeoX: half a cosine from the peak to `min_lr` over the decay."""

    def lr(self, s):
        n, span = _since_warmup(s)
        return s.min_lr + (s.peak_lr - s.min_lr) / 2.0 * (math.cos(math.pi * n / span) + 1)


class Exponential(DecayStyle):
    """GPT-NeoX: the LR halves over the decay (exp(-0.693)), clipped at `min_lr`."""

    def lr(self, s):
        n, span = _since_warmup(s)
        return s.peak_lr * math.exp(-LN2_NEOX * n / span)


class InverseSqrt(DecayStyle):
    """peak × sqrt(warmup / num_iters) (Megatron-LM), independent of the decay length."""

    def lr(self, s):
        warmup = max(s.warmup_iters, 1)
        return s.peak_lr * math.sqrt(warmup) / math.sqrt(max(s.num_iters, warmup))


class Inverse(DecayStyle):
    """Levanter's `inv`: peak / (1 + (peak / min_lr - 1) × max(n - w, 1) / (D - w)), at most
    the peak; it reaches `min_lr` at the end of the decay (so needs min_lr > 0)."""

    def lr(self, s):
        n, span = _since_warmup(s)
        return s.peak_lr * min(1.0, 1.0 / ((s.peak_lr / s.min_lr - 1.0) * max(n, 1) / span + 1.0))


class WarmupStableDecay(DecayStyle):
    """Peak LR until the last `wsd_decay_fraction` × decay_iters iterations, which decay with
    `wsd_decay_style` from the peak to `min_lr` and then stay there."""

    def lr(self, s):
        window = s.wsd_decay_fraction * s.decay_iters
        start = s.decay_iters - window
        if window <= 0 or s.num_iters <= start:
            return s.peak_lr
        q = min(1.0, (s.num_iters - start) / window)
        return WSD_TAILS[s.wsd_decay_style].lr(q, s.peak_lr, s.min_lr)


class Tail:
    """A `wsd` final decay: progress `q` in [0, 1] to an LR from `peak` to `min_lr`."""

    def lr(self, q: float, peak: float, min_lr: float) -> float:
        raise NotImplementedError


class LinearTail(Tail):
    def lr(self, q, peak, min_lr):
        return min_lr + (peak - min_lr) * (1.0 - q)


class CosineTail(Tail):
    def lr(self, q, peak, min_lr):
        return min_lr + (peak - min_lr) * 0.5 * (1.0 + math.cos(math.pi * q))


class ExponentialTail(Tail):
    """Megatron-LM's exponential WSD decay: the coefficient `2 · 0.5^q - 1` falls from 1 to 0
    (halving's curve), so the LR reaches `min_lr` at the end of the decay."""

    def lr(self, q, peak, min_lr):
        return min_lr + (peak - min_lr) * (2.0 * 0.5**q - 1.0)


class MinusSqrtTail(Tail):
    """1 - sqrt(q): the `inverse_sqrt` flavour of the wsd decay."""

    def lr(self, q, peak, min_lr):
        return min_lr + (peak - min_lr) * (1.0 - math.sqrt(q))


DECAY_STYLES: dict[str, DecayStyle] = {
    "constant": Constant(),
    "linear": Linear(),
    "cosine": Cosine(),
    "exponential": Exponential(),
    "inverse_sqrt": InverseSqrt(),
    "wsd": WarmupStableDecay(),
    "inv": Inverse(),
}

WSD_TAILS: dict[str, Tail] = {
    "linear": LinearTail(),
    "cosine": CosineTail(),
    "exponential": ExponentialTail(),
    "inverse_sqrt": MinusSqrtTail(),
}
