"""`pretrain(cfg)`: set up a run, train it, evaluate it. Called by `train.py` on every rank.

Set-up order matters: distributed and topology; the same seed everywhere, then the model
(identical full weights on every rank); the engine; the checkpoint (weights, optimizer,
scheduler, position); the data iterators; then the RNG state of the checkpoint, so that a
resumed run draws exactly what the unbroken run drew (see `checkpointing.CheckpointIO.load`).
The loop itself only steps, counts and asks its callbacks (`callbacks.py`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from megatron.training.batches import BatchSettings
from megatron.training.callbacks import (
    CheckpointCallback,
    EvaluationCallback,
    LoggingCallback,
)
from megatron.training.checkpointing import CheckpointIO, SaveSchedule
from megatron.training.data_setup import (
    BatchFactory,
    build_datasets,
    resolve_train_iters,
    valid_samples_consumed,
)
from megatron.training.engine_setup import build_engine
from megatron.training.evaluation import EvalResult, Evaluator
from megatron.training.flops import peak_tflops, shape_from_config, training_flops_per_token
from megatron.training.initialize import initialize_distributed, seed_everything
from megatron.training.loggers import build_loggers
from megatron.training.loss_scaling import SkippedStepGuard, current_loss_scale
from megatron.training.monitor import TrainMonitor
from megatron.training.norms import GradNormRecorder
from megatron.training.report import startup_report
from megatron.training.signals import StopRequest
from megatron.training.steps import engine_steps

log = logging.getLogger(__name__)


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
    ):
        self.steps, self.engine, self.lr_scheduler = steps, engine, lr_scheduler
        self.batches, self.state, self.train_iters = batches, state, train_iters
        self.global_batch, self.guard, self.loggers = global_batch, guard, loggers
        self.callbacks, self.exit_interval, self.stop = callbacks, exit_interval, stop
        self.last_loss, self.last_applied = 0.0, True
        self.losses: list[float] = []

    def trainer_state(self) -> dict[str, Any]:
        return {
            "iteration": self.state.iteration,
            "consumed_samples": self.state.consumed_samples,
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "skipped_steps": self.guard.state_dict(),
        }

    def _should_stop(self) -> bool:
        it = self.state.iteration
        by_interval = bool(self.exit_interval) and it % self.exit_interval == 0
        return (self.stop is not None and self.stop.agreed()) or by_interval

    def run(self) -> bool:
        """Train; True when stopped early (exit_interval or a signal)."""
        stopped = False
        while self.state.iteration < self.train_iters and not stopped:
            self.last_loss = self.steps.train_step(self.batches)
            self.last_applied = self.steps.step_applied
            self.state.iteration += 1
            self.state.consumed_samples += self.global_batch
            self.losses.append(self.last_loss)
            loss_scale = current_loss_scale(self.engine)
            self.guard.update(self.last_applied, self.state.iteration, loss_scale)
            for callback in self.callbacks:
                callback.after_step(self)
            stopped = self.state.iteration < self.train_iters and self._should_stop()
        for callback in self.callbacks:
            callback.on_end(self, stopped)
        return stopped


def pretrain(cfg) -> TrainResult:
    """Train the model `cfg` describes (see the module docstring)."""
    from megatron.data import build_tokenizer
    from megatron.model import count_parameters
    from megatron.parallel import get_rng_tracker

    topology = initialize_distributed(cfg)
    rank = dist.get_rank()
    seed_everything(cfg.training.seed)
    tokenizer = build_tokenizer(cfg)
    train_iters = resolve_train_iters(cfg)
    parts = build_engine(cfg, topology, train_iters)
    engine, c = parts.engine, cfg.checkpointing
    io = CheckpointIO(
        engine,
        c.save,
        cfg.to_dict(),
        c.keep_last_n_checkpoints,
        save_rng=not c.no_save_rng,
        save_optim=not c.no_save_optim,
        tracker=get_rng_tracker(),
    )
    guard = SkippedStepGuard(cfg.precision.max_consecutive_skipped_steps)
    loaded = io.load(
        c.load, finetune=c.finetune, load_optim=not c.no_load_optim, load_rng=not c.no_load_rng
    )
    state = TrainState()
    if loaded:
        state = TrainState(loaded["iteration"], loaded["consumed_samples"])
        parts.lr_scheduler.load_state_dict(loaded["lr_scheduler"])
        guard.load_state_dict(loaded.get("skipped_steps", {}))

    train_ds, valid_ds, test_ds = build_datasets(cfg, train_iters)
    settings = BatchSettings.from_config(cfg, tokenizer.eod)
    make_batches = BatchFactory(cfg, topology, settings, engine.device)
    train_batches = make_batches(train_ds, state.consumed_samples)
    valid_batches = make_batches(valid_ds, valid_samples_consumed(cfg, state.iteration))
    io.restore_rng(loaded)

    t = cfg.training
    flops = training_flops_per_token(shape_from_config(cfg))
    loggers = build_loggers(cfg, rank, train_iters)
    sizes = {"train": train_ds, "valid": valid_ds, "test": test_ds}
    loggers.log_text(
        startup_report(
            cfg,
            topology,
            parameters=count_parameters(cfg),
            flops_per_token=flops,
            train_iters=train_iters,
            resumed_from=state.iteration,
            dataset_sizes={k: len(v) if v is not None else None for k, v in sizes.items()},
        )
    )

    steps = engine_steps(engine, topology)
    evaluator = Evaluator(steps, valid_batches, t.eval_interval, t.eval_iters, loggers)
    peak = peak_tflops(cfg.precision.dtype, cfg.logging.peak_theoretical_tflops)
    monitor = TrainMonitor(
        t.train_batch_size * cfg.model.seq_length, flops, topology.world_size, peak, train_iters
    )
    lg = cfg.logging
    callbacks = [
        LoggingCallback(
            monitor,
            loggers,
            lg.log_interval,
            lg.wall_clock_breakdown,
            param_norms_of=parts.model if lg.log_param_norm and rank == 0 else None,
            grad_norms=GradNormRecorder(parts.model) if lg.log_grad_norm and rank == 0 else None,
        ),
        EvaluationCallback(evaluator),
        CheckpointCallback(io, SaveSchedule.from_config(cfg, train_iters), bool(c.save)),
    ]
    stop = StopRequest().install()
    loop = TrainLoop(
        steps=steps,
        engine=engine,
        lr_scheduler=parts.lr_scheduler,
        batches=train_batches,
        state=state,
        train_iters=train_iters,
        global_batch=t.train_batch_size,
        guard=guard,
        loggers=loggers,
        callbacks=callbacks,
        exit_interval=t.exit_interval,
        stop=stop,
    )
    try:
        stopped = loop.run()
    finally:
        stop.uninstall()
    result = TrainResult(state.iteration, loop.losses, stopped=stopped)
    if not stopped:
        if not evaluator.due(state.iteration):
            evaluator.run(state.iteration)
        result.valid = evaluator.last
        if t.do_test:
            result.test = evaluator.run(state.iteration, "test", make_batches(test_ds, 0))
    loggers.close()
    return result
