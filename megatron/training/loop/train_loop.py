"""The training loop: step until `train_iters`, `exit_interval` or a signal; every feature
around the step (logging, evaluation, checkpointing, profiling) is a callback
(`callbacks.py`). `megatron/training/pretrain.py` builds everything the loop is given.

A train step's loss stays on the device (`losses` holds 0-dim tensors) until the logging
callback reads its interval's losses in one transfer and hands the floats back
(`keep_host_losses`); whatever is left is read when the loop ends, so `TrainResult.losses`
holds floats and a step that does not log waits for nothing (`docs/performance.md`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from megatron.training.loop.evaluation import EvalResult
from megatron.training.metrics.monitor import host_floats


@dataclass
class TrainState:
    """Run state that a checkpoint carries (the config stays frozen)."""

    iteration: int = 0
    consumed_samples: int = 0


@dataclass
class TrainResult:
    """What `pretrain` returns (on every rank)."""

    iteration: int
    losses: list[float] = field(default_factory=list)
    valid: EvalResult | None = None
    test: EvalResult | None = None
    stopped: bool = False


class TrainLoop:
    """Steps until `train_iters`, `exit_interval` or a signal; callbacks do the rest."""

    def __init__(
        self,
        *,
        steps,
        engine,
        lr_scheduler,
        batches,
        state,
        train_iters,
        global_batch,
        guard,
        loggers,
        callbacks,
        exit_interval=None,
        stop=None,
        facts=None,
        curriculum=None,
    ):
        self.steps, self.engine, self.lr_scheduler = steps, engine, lr_scheduler
        self.batches, self.state, self.train_iters = batches, state, train_iters
        self.global_batch, self.guard, self.loggers = global_batch, guard, loggers
        self.callbacks, self.exit_interval, self.stop = callbacks, exit_interval, stop
        self.facts = dict(facts or {})  # fixed for the run: layout, samples the data holds
        self.curriculum = curriculum  # sequence-length curriculum (setup/curriculum.py)
        self.last_loss, self.last_applied = 0.0, True
        self.losses: list = []  # floats, or 0-dim device tensors not read yet

    def keep_host_losses(self, floats: list[float]) -> None:
        """The host values of the last `len(floats)` steps' losses, read by a callback."""
        if floats:
            self.losses[-len(floats) :] = floats

    def trainer_state(self) -> dict[str, Any]:
        return {
            "iteration": self.state.iteration,
            "consumed_samples": self.state.consumed_samples,
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "skipped_steps": self.guard.state_dict(),
            **self.facts,
            **({"curriculum": self.curriculum.state_dict()} if self.curriculum else {}),
        }

    def _should_stop(self) -> bool:
        it = self.state.iteration
        by_interval = bool(self.exit_interval) and it % self.exit_interval == 0
        return (self.stop is not None and self.stop.agreed()) or by_interval

    def run(self) -> bool:
        """Train; True when stopped early (exit_interval or a signal)."""
        stopped = False
        try:
            for callback in self.callbacks:
                callback.on_start(self)
            while self.state.iteration < self.train_iters and not stopped:
                if self.curriculum is not None:
                    self.curriculum.begin_step(self.state.iteration)
                self.last_loss = self.steps.train(self.batches)
                self.last_applied = self.steps.step_applied
                self.state.iteration += 1
                self.state.consumed_samples += self.global_batch
                self.losses.append(self.last_loss)
                for callback in self.callbacks:
                    callback.after_step(self)
                stopped = self.state.iteration < self.train_iters and self._should_stop()
        except Exception as error:
            for callback in self.callbacks:
                callback.on_abort(self, error)
            raise
        for callback in self.callbacks:
            callback.on_end(self, stopped)
        self.losses = host_floats(self.losses)
        return stopped
