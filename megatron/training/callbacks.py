"""What hangs off the training loop: logging, evaluation, checkpointing, each a callback.

`TrainLoop` calls `after_step(loop)` on each callback after every iteration, in order, and
`on_end(loop, stopped)` once when training ends (normally or on a stop request).
"""

from __future__ import annotations

import math

import torch

from megatron.training.checkpointing import CheckpointIO, SaveSchedule
from megatron.training.loss_scaling import current_loss_scale
from megatron.training.norms import parameter_norms


class Callback:
    def after_step(self, loop) -> None:
        """After every iteration (`loop.state.iteration` is the one just finished)."""

    def on_end(self, loop, stopped: bool) -> None:
        """Once, after the last iteration; `stopped`: by exit_interval or a signal."""


def _float(value) -> float | None:
    if value is None:
        return None
    value = float(value.item() if isinstance(value, torch.Tensor) else value)
    return value if math.isfinite(value) else None


def engine_timers(engine) -> dict[str, float]:
    """DeepSpeed's `wall_clock_breakdown` timers (forward, backward, optimizer step, pipeline
    send/receive, ...) in ms since the last call, which resets them."""
    timers = getattr(engine, "timers", None)
    found = timers.get_timers() if timers is not None and hasattr(timers, "get_timers") else {}
    return {name: timer.elapsed(reset=True) for name, timer in found.items()}


class LoggingCallback(Callback):
    """A training record every `log_interval` iterations (TrainMonitor → loggers)."""

    def __init__(
        self,
        monitor,
        loggers,
        log_interval: int,
        wall_clock_breakdown: bool = False,
        param_norms_of=None,
        grad_norms=None,
    ):
        self.monitor = monitor
        self.loggers = loggers
        self.interval = max(1, log_interval)
        self.timers = wall_clock_breakdown
        self.param_norms_of = param_norms_of  # the model, with log_param_norm
        self.grad_norms = grad_norms  # a GradNormRecorder, with log_grad_norm

    def after_step(self, loop):
        self.monitor.step(loop.last_loss, loop.last_applied)
        if loop.state.iteration % self.interval == 0:
            self._log(loop)

    def on_end(self, loop, stopped):
        if self.monitor.steps:
            self._log(loop)

    def _log(self, loop):
        engine = loop.engine
        record = self.monitor.record(
            loop.state.iteration,
            lr=loop.lr_scheduler.get_lr(),
            grad_norm=_float(engine.get_global_grad_norm()),
            loss_scale=current_loss_scale(engine),
            timers=engine_timers(engine) if self.timers else None,
        )
        if self.param_norms_of is not None:
            record.update(parameter_norms(self.param_norms_of))
        if self.grad_norms is not None:
            record.update(self.grad_norms.collect())
        self.loggers.log_train(record)


class EvaluationCallback(Callback):
    """Validation every `eval_interval` iterations."""

    def __init__(self, evaluator):
        self.evaluator = evaluator

    def after_step(self, loop):
        if self.evaluator.due(loop.state.iteration):
            self.evaluator.run(loop.state.iteration)


class CheckpointCallback(Callback):
    """Saves on the schedule and when the run stops early (exit_interval, signal)."""

    def __init__(self, io: CheckpointIO, schedule: SaveSchedule, enabled: bool):
        self.io = io
        self.schedule = schedule
        self.enabled = enabled
        self.last_saved = None

    def save(self, loop) -> None:
        if self.enabled and self.last_saved != loop.state.iteration:
            self.io.save(loop.state.iteration, loop.trainer_state())
            self.last_saved = loop.state.iteration
            loop.loggers.log_text(f"saved checkpoint global_step{loop.state.iteration}")

    def after_step(self, loop):
        if self.schedule.should_save(loop.state.iteration):
            self.save(loop)

    def on_end(self, loop, stopped):
        if stopped:
            self.save(loop)
