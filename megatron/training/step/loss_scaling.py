"""The loss scale a run reports, and the skipped-step guard.

fp16 dynamic loss scaling itself (an overflowing step is skipped and the scale shrinks after
`hysteresis` overflows; after `loss_scale_window` clean steps it grows back; never below
`min_loss_scale`) is set up on the engine by `fp16_scaler.install_loss_scaler`.

`SkippedStepGuard` is ours, for every precision: a step is skipped when fp16 overflows or
when the loss or gradient norm is inf/NaN (`nonfinite.py`); a run whose every step is skipped
would otherwise loop forever; after `max_consecutive_skipped_steps` skipped steps in a row it
stops the run with an explanation naming the iteration.
"""

from __future__ import annotations


class TooManySkippedSteps(RuntimeError):
    """Too many consecutive optimizer steps were skipped (inf/NaN loss or gradients)."""


def current_loss_scale(engine) -> float | None:
    """The loss scale of a DeepSpeed engine's fp16 optimizer; None when it has none."""
    if not engine.fp16_enabled():
        return None
    scale = getattr(engine.optimizer, "loss_scale", None)
    return float(scale) if isinstance(scale, int | float) else None


class SkippedStepGuard:
    """Counts skipped (overflowing) steps; raises after too many in a row.

    `update(applied)` is called once per optimizer step with whether the engine applied it.
    """

    def __init__(self, max_consecutive: int):
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive_skipped_steps must be >= 1, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total = 0

    def update(self, applied: bool, iteration: int, loss_scale: float | None = None) -> None:
        if applied:
            self.consecutive = 0
            return
        self.consecutive += 1
        self.total += 1
        if self.consecutive >= self.max_consecutive:
            scale = f" (loss scale now {loss_scale:g})" if loss_scale is not None else ""
            raise TooManySkippedSteps(
                f"stopping at iteration {iteration}: the last {self.consecutive} optimizer steps "
                "were all skipped because the loss or the gradients were not finite (inf/nan)"
                f"{scale}. The loss has most likely diverged or the data holds bad values. Try "
                "a lower learning rate or longer warm-up, bf16 instead of fp16, a larger "
                "fp16.min_loss_scale/hysteresis, or resume from an earlier checkpoint (no "
                "checkpoint holding inf/nan is ever saved); max_consecutive_skipped_steps sets "
                "this limit."
            )

    def state_dict(self) -> dict:
        return {"consecutive": self.consecutive, "total": self.total}

    def load_state_dict(self, state: dict) -> None:
        self.consecutive = int(state.get("consecutive", 0))
        self.total = int(state.get("total", 0))
