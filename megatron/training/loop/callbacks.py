"""What hangs off the training loop: logging, evaluation, checkpointing, each a callback.

`TrainLoop` calls `on_start(loop)` on each callback before the first iteration of the run,
`after_step(loop)` after every iteration, in order, and
`on_end(loop, stopped)` once when training ends (normally or on a stop request), or
`on_abort(loop, error)` when an error ends it (e.g. too many skipped steps in a row).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from megatron.checkpoint.folders import tag_for
from megatron.training.checkpoint.checkpoint_io import CheckpointIO
from megatron.training.checkpoint.policy import CheckpointPolicy, retire_temporaries
from megatron.training.metrics.loggers.console import format_duration
from megatron.training.metrics.norms import parameter_norms
from megatron.training.step.loss_scaling import SkippedStepGuard, current_loss_scale

log = logging.getLogger(__name__)


class Callback:
    def on_start(self, loop) -> None:
        """Once, before the first iteration (`loop.state.iteration` steps are already done)."""

    def after_step(self, loop) -> None:
        """After every iteration (`loop.state.iteration` is the one just finished)."""

    def on_end(self, loop, stopped: bool) -> None:
        """Once, after the last iteration; `stopped`: by exit_interval or a signal."""

    def on_abort(self, loop, error: Exception) -> None:
        """Once, when `error` ends training; nothing collective may run here."""


def _float(value) -> float | None:
    """A figure for the logs; inf/NaN stay as they are (a diverged run must show it)."""
    if value is None:
        return None
    return float(value.item() if isinstance(value, torch.Tensor) else value)


class EngineTimers:
    """DeepSpeed's `wall_clock_breakdown` timers (forward, backward, optimizer step, pipeline
    send/receive, ...): ms spent in each since the last `collect()`, for the training record
    (`time/*` in metrics.jsonl).

    DeepSpeed prints them itself, `[Rank 0] time (ms) | fwd_microstep: ...` (`timers.log`: at
    every optimizer step on the plain engine, every `steps_per_print` steps on the pipeline
    engine), and resets them as it prints. With `verbose` (a worker of `deepy.py --verbose`) it
    still does, and the wrapper installed on `engine.timers.log` adds up what each print reads
    before the reset (read at our log interval alone, the plain engine's timers gave zeros).
    Without, the wrapper prints and resets nothing: the console has our iteration line, and
    `collect` reads each timer's whole interval at once. Either way `collect` adds what is
    still in the timers and starts the next interval."""

    def __init__(self, engine, *, verbose: bool):
        self.sums: dict[str, float] = {}
        self.timers = getattr(engine, "timers", None)
        if self.timers is None or not hasattr(self.timers, "get_timers"):
            self.timers = None
            return
        if not verbose:
            self.timers.log = lambda *args, **kwargs: None  # kept for collect()
            return
        printed = self.timers.log

        def log(names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None):
            if reset:  # else the time stays in the timer for collect()
                for name in names:
                    timer = self.timers.get_timers().get(name)
                    if timer is not None:
                        self._add(name, timer.elapsed(reset=False))
            return printed(names, normalizer, reset, memory_breakdown, ranks)

        self.timers.log = log

    def _add(self, name: str, ms: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + ms

    def collect(self) -> dict[str, float]:
        if self.timers is None:
            return {}
        for name, timer in self.timers.get_timers().items():
            self._add(name, timer.elapsed(reset=True))
        sums, self.sums = self.sums, {}
        return sums


class LoggingCallback(Callback):
    """A training record every `log_interval` iterations (TrainMonitor → loggers).

    After the run's first step, unless it is logged anyway, a line says how long it took and
    at which iteration the next line comes, and about when at that pace: the start-up report
    was the last line until then, and with `log_interval: 20` on two CPU cores the next came
    minutes later. A rough figure (the first step also warms up; a busy machine's pace
    varies), but it says the run is alive and what to expect."""

    def __init__(
        self,
        monitor,
        loggers,
        log_interval: int,
        timers: EngineTimers | None = None,
        param_norms_of=None,
        grad_norms=None,
    ):
        self.monitor = monitor
        self.loggers = loggers
        self.interval = max(1, log_interval)
        self.timers = timers  # with wall_clock_breakdown
        self.param_norms_of = param_norms_of  # the model, with log_param_norm
        self.grad_norms = grad_norms  # a GradNormRecorder, with log_grad_norm
        self.first_step = 1

    def on_start(self, loop):
        self.first_step = loop.state.iteration + 1

    def after_step(self, loop):
        extras = {  # router losses of MoE models, the objective's metrics (DPO, KTO, ...)
            **(getattr(loop.steps, "moe_losses", None) or {}),
            **(getattr(loop.steps, "objective_metrics", None) or {}),
        }
        curriculum = getattr(loop, "curriculum", None)  # the step's real length (curriculum.py)
        work = curriculum.work if curriculum is not None else None
        self.monitor.step(loop.last_loss, loop.last_applied, extras, work)
        if loop.state.iteration % self.interval == 0:
            self._log(loop)
        elif self.first_step == loop.state.iteration < loop.train_iters:
            self._first_step_done(loop.state.iteration, loop.train_iters)

    def _first_step_done(self, iteration: int, train_iters: int) -> None:
        seconds = self.monitor.clock() - self.monitor.interval_start
        following = min(train_iters, (iteration // self.interval + 1) * self.interval)
        took = f"{seconds:.1f} s" if seconds < 60 else format_duration(seconds)
        eta = format_duration(seconds * (following - iteration))
        self.loggers.log_text(
            f"first step done in {took} (iteration {iteration} of {train_iters}); the next "
            f"line comes at iteration {following}, in about {eta} at that pace"
        )

    def on_end(self, loop, stopped):
        if self.monitor.steps:
            self._log(loop)

    def on_abort(self, loop, error):
        if self.monitor.steps:
            self._log(loop)
        name, it = type(error).__name__, loop.state.iteration
        self.loggers.log_text(f"training stopped at iteration {it} ({name}): {error}")

    def _log(self, loop):
        engine = loop.engine
        record = self.monitor.record(
            loop.state.iteration,
            lr=loop.lr_scheduler.get_lr(),
            grad_norm=_float(engine.get_global_grad_norm()),
            loss_scale=current_loss_scale(engine),
            timers=self.timers.collect() if self.timers is not None else None,
        )
        if getattr(loop, "curriculum", None) is not None:
            record["curriculum_seqlen"] = loop.curriculum.length  # GPT-NeoX's name
        loop.keep_host_losses(self.monitor.settled)
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


class SkippedStepsCallback(Callback):
    """Counts skipped steps; stops the run (`TooManySkippedSteps`) after too many in a row.

    Every rank takes the same decision: whether a step was applied is agreed over the world
    (`nonfinite.py`, and DeepSpeed's own overflow checks)."""

    def __init__(self, guard: SkippedStepGuard):
        self.guard = guard

    def after_step(self, loop):
        self.guard.update(loop.last_applied, loop.state.iteration, current_loss_scale(loop.engine))


class CheckpointCallback(Callback):
    """Saves what the policy asks after each iteration (`checkpoint/policy.py`: permanent tier,
    step schedule, temporary) and when the run stops early (exit_interval, signal); then
    retires the previous temporary checkpoint. Never a state that holds inf/NaN (`is_finite`,
    collective, asked before each save), so `latest` stays on the last finite checkpoint."""

    def __init__(self, io: CheckpointIO, policy: CheckpointPolicy, enabled: bool, is_finite=None):
        self.io = io
        self.policy = policy
        self.enabled = enabled
        self.is_finite = is_finite
        self.last_saved = None

    def save(self, loop, kind: str) -> None:
        if not self.enabled or self.last_saved == loop.state.iteration:
            return
        tag = tag_for(loop.state.iteration, kind)
        if self.is_finite is not None and not self.is_finite():
            message = (
                f"not saving checkpoint {tag}: the weights or optimizer state hold inf/NaN; "
                "`latest` stays on the last finite checkpoint"
            )
            log.warning(message)
            loop.loggers.log_text(message)
            return
        self.io.save(loop.state.iteration, loop.trainer_state(), kind)
        self.last_saved = loop.state.iteration
        self.policy.saved()
        if _global_rank() == 0:  # after the save's last barrier: `latest` names `tag`
            retire_temporaries(self.io.save_dir, tag)
        loop.loggers.log_text(
            f"saved checkpoint {tag}" + (" (permanent)" if kind == "permanent" else "")
        )

    def on_start(self, loop):
        stop = getattr(loop, "stop", None)
        if self.enabled and self.policy.interval is not None and stop is not None:
            stop.ride(self.policy)  # the time check costs no collective of its own

    def after_step(self, loop):
        if not self.enabled:
            return
        kind = self.policy.decide(loop.state.iteration)
        if kind is not None:
            self.save(loop, kind)

    def on_end(self, loop, stopped):
        if stopped:
            iteration = loop.state.iteration
            self.save(loop, "permanent" if self.policy.is_permanent(iteration) else "step")


def _global_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0
