"""fp16 loss scaling: DeepSpeed's scaler as our config builds it, and the skipped-step guard.

DeepSpeed owns dynamic loss scaling (an overflowing step is skipped and the scale shrinks;
after `loss_scale_window` clean steps it grows back). `loss_scaler_from_deepspeed_config`
builds DeepSpeed's own scaler from the `fp16` section we export, exactly as its ZeRO
optimizers do, so the behaviour can be tested on CPU, where DeepSpeed refuses fp16 training.
(DeepSpeed's non-ZeRO fp16 optimizer keeps its own copy of this logic without `hysteresis`.)

`SkippedStepGuard` is ours: a run whose every step overflows would otherwise loop forever
at the minimum scale; after `max_consecutive_skipped_steps` skipped steps in a row it stops
the run with an explanation.
"""

from __future__ import annotations

import torch


class TooManySkippedSteps(RuntimeError):
    """Too many consecutive optimizer steps were skipped because gradients overflowed."""


def loss_scaler_from_deepspeed_config(ds_config: dict):
    """DeepSpeed's loss scaler for a DeepSpeed config dict (static 1.0 without fp16)."""
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    from deepspeed.runtime.precision_config import DeepSpeedFP16Config

    section = ds_config.get("fp16") or {}
    if not section.get("enabled", False):
        return CreateLossScaler(torch.float32, 1.0, False, None)
    fp16 = DeepSpeedFP16Config(**section)
    return CreateLossScaler(
        torch.float16,
        static_loss_scale=fp16.loss_scale,
        dynamic_scaling=fp16.loss_scale == 0,
        dynamic_loss_args=fp16.dynamic_loss_scale_args(),
    )


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
                f"were all skipped because the gradients overflowed (inf/nan){scale}. The "
                "loss has most likely diverged or the data holds bad values. Try a lower "
                "learning rate or longer warm-up, bf16 instead of fp16, a larger "
                "fp16.min_loss_scale/hysteresis, or resume from an earlier checkpoint; "
                "max_consecutive_skipped_steps sets this limit."
            )

    def state_dict(self) -> dict:
        return {"consecutive": self.consecutive, "total": self.total}

    def load_state_dict(self, state: dict) -> None:
        self.consecutive = int(state.get("consecutive", 0))
        self.total = int(state.get("total", 0))
