"""`pretrain(cfg)`: set up a run, train it, evaluate it. Called by `train.py` on every rank.

Set-up order matters: distributed and topology; the same seed everywhere, then the model
(identical full weights on every rank); the engine; the checkpoint (weights, optimizer,
scheduler, position); the data iterators; then the RNG state of the checkpoint, so that a
resumed run draws exactly what the unbroken run drew (see `checkpointing.CheckpointIO.load`).
The loop itself only steps, counts and asks its callbacks (`callbacks.py`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed as dist

from megatron.checkpoint.size import checkpoint_size
from megatron.config.verbosity import verbose_logging
from megatron.launcher.worker import initialize_distributed
from megatron.parallel.random import seed_everything
from megatron.training.checkpoint.checkpoint_io import CheckpointIO
from megatron.training.checkpoint.experts import ExpertCheckpoint
from megatron.training.checkpoint.policy import CheckpointPolicy
from megatron.training.loop.callbacks import (
    CheckpointCallback,
    EngineTimers,
    EvaluationCallback,
    LoggingCallback,
    SkippedStepsCallback,
)
from megatron.training.loop.evaluation import Evaluator
from megatron.training.loop.profiling import ProfilerCallback, ProfileSettings
from megatron.training.loop.signals import StopRequest
from megatron.training.loop.train_loop import TrainLoop, TrainResult, TrainState
from megatron.training.metrics.flops import peak_tflops, step_work
from megatron.training.metrics.loggers import build_loggers
from megatron.training.metrics.monitor import TrainMonitor
from megatron.training.metrics.norms import GradNormRecorder
from megatron.training.metrics.report import (
    final_summary,
    layout_change_notice,
    run_layout,
    run_start_record,
    startup_report,
)
from megatron.training.objectives import build_objective
from megatron.training.objectives.reference import build_reference
from megatron.training.setup.batches import BatchSettings
from megatron.training.setup.curriculum import SeqlenCurriculum
from megatron.training.setup.data import (
    BatchFactory,
    build_datasets,
    resolve_train_iters,
    train_samples_needed,
    valid_samples_consumed,
)
from megatron.training.setup.engine import build_engine
from megatron.training.setup.resume_vocab import with_checkpoint_vocab
from megatron.training.step.loss_scaling import SkippedStepGuard
from megatron.training.step.nonfinite import NonFiniteSteps, state_is_finite
from megatron.training.step.steps import engine_steps

log = logging.getLogger(__name__)


def _resume(cfg, io: CheckpointIO, parts, guard) -> tuple[TrainState, dict | None]:
    """Load `cfg.checkpointing.load` (if any) into the engine, scheduler and guard."""
    c = cfg.checkpointing
    loaded = io.load(
        c.load, finetune=c.finetune, load_optim=not c.no_load_optim, load_rng=not c.no_load_rng
    )
    if not loaded:
        return TrainState(), loaded
    parts.lr_scheduler.load_state_dict(loaded["lr_scheduler"])
    guard.load_state_dict(loaded.get("skipped_steps", {}))
    return TrainState(loaded["iteration"], loaded["consumed_samples"]), loaded


def _callbacks(cfg, *, monitor, loggers, evaluator, io, parts, guard, rank, train_iters) -> list:
    lg, model = cfg.logging, parts.model
    on_rank0 = rank == 0
    timers = (
        EngineTimers(parts.engine, verbose=verbose_logging()) if lg.wall_clock_breakdown else None
    )
    return [
        LoggingCallback(
            monitor,
            loggers,
            lg.log_interval,
            timers,
            param_norms_of=model if lg.log_param_norm and on_rank0 else None,
            grad_norms=GradNormRecorder(model) if lg.log_grad_norm and on_rank0 else None,
        ),
        SkippedStepsCallback(guard),
        EvaluationCallback(evaluator),
        CheckpointCallback(
            io,
            CheckpointPolicy.from_config(cfg, train_iters),
            bool(cfg.checkpointing.save),
            is_finite=lambda: state_is_finite(parts.engine, parts.optimizer),
        ),
    ] + _profiler(cfg, rank)


def _profiler(cfg, rank) -> list:
    settings = ProfileSettings.from_config(cfg)
    return [ProfilerCallback(settings, rank)] if settings is not None else []


def _report(cfg, topology, loggers, work, train_iters, state, datasets, notice, folder) -> None:
    sizes = dict(zip(("train", "valid", "test"), datasets))
    loggers.log_text(
        startup_report(
            cfg,
            topology,
            parameters=_count_parameters(cfg),
            work=work,
            train_iters=train_iters,
            resumed_from=state.iteration,
            resumed_folder=folder,
            dataset_sizes={k: len(v) if v is not None else None for k, v in sizes.items()},
            layout_notice=notice,
            backend=dist.get_backend(),
        )
    )


def _same_valid_batches(make_batches, dataset):
    """A fresh iterator over the validation split from its start, for each evaluation
    (`eval_fixed_samples`). Making one draws a seed from torch's generator: that draw is
    undone, so dropout during training is the same with the key as without it."""

    def restart():
        with torch.random.fork_rng(devices=[]):
            return make_batches(dataset, 0)

    return restart


def _count_parameters(cfg) -> int:
    from megatron.model import count_parameters

    return count_parameters(cfg)


def pretrain(cfg) -> TrainResult:
    """Train the model `cfg` describes (see the module docstring)."""
    from megatron.data import build_tokenizer
    from megatron.parallel import get_rng_tracker

    cfg = with_checkpoint_vocab(cfg)  # a resumed run keeps its checkpoint's padded size
    topology = initialize_distributed(cfg)
    rank = dist.get_rank()
    objective = build_objective(cfg, topology.tp_group)
    seed_everything(cfg.training.seed)
    tokenizer = build_tokenizer(cfg)
    train_iters = resolve_train_iters(cfg)
    reference = build_reference(cfg, topology, objective)  # before the policy (reference.py)
    if reference is not None:
        seed_everything(cfg.training.seed)  # the policy draws what it draws without one
    parts = build_engine(cfg, topology, train_iters, objective)
    engine, c, t = parts.engine, cfg.checkpointing, cfg.training
    io = CheckpointIO(
        engine,
        c.save,
        cfg.to_dict(),
        c.keep_last_n_checkpoints,
        save_rng=not c.no_save_rng,
        save_optim=not c.no_save_optim,
        tracker=get_rng_tracker(),
        needed_bytes=checkpoint_size(cfg).total,
        experts=ExpertCheckpoint(engine.module, engine.optimizer, topology),
    )
    guard = SkippedStepGuard(cfg.precision.max_consecutive_skipped_steps)
    state, loaded = _resume(cfg, io, parts, guard)
    layout = run_layout(cfg, topology)
    notice = layout_change_notice(loaded.get("layout") if loaded else None, layout)
    if notice:  # another rank's stream (or none) would be restored: start from the seed
        loaded["rng_state"] = None
    facts = {"layout": layout}
    if reference is not None:
        facts["reference"] = reference.load(cfg, loaded)
        if facts["reference"]["tag"] is not None:  # a resume loads it again: never prune it
            io.pinned.append(Path(facts["reference"]["load"]) / facts["reference"]["tag"])
    train_samples = train_samples_needed(train_iters, t.train_batch_size, loaded)

    datasets = build_datasets(cfg, train_iters, train_samples)
    settings = BatchSettings.from_config(cfg, tokenizer.eod)
    make_batches = BatchFactory(cfg, topology, settings, engine.device, objective)
    train_batches = make_batches(datasets[0], state.consumed_samples)
    curriculum = SeqlenCurriculum.from_config(cfg, lambda n: step_work(cfg, objective, n))
    if curriculum is not None:
        curriculum.resume(state.iteration, loaded.get("curriculum") if loaded else None)
        train_batches = curriculum.truncated(train_batches)
    valid_batches = make_batches(datasets[1], valid_samples_consumed(cfg, state.iteration))
    io.restore_rng(loaded)  # after the iterators: creating one draws from torch's generator

    work = step_work(cfg, objective)  # tokens and FLOPs of a step (flops.py)
    loggers = build_loggers(cfg, rank, train_iters)
    started_at = state.iteration
    try:
        folder = loaded.get("folder") if loaded else None
        start = run_start_record(
            cfg,
            started_at=started_at,
            resumed_from=folder,
            train_iters=train_iters,
            world_size=topology.world_size,
        )
        loggers.log_run(start)
        _report(cfg, topology, loggers, work, train_iters, state, datasets, notice, folder)
        steps = engine_steps(engine, topology, objective, reference, curriculum)
        stop = StopRequest()  # its flag rides on the non-finite check's all-reduce
        NonFiniteSteps(engine, parts.optimizer, topology, steps.local_loss, stop).install()
        restart = _same_valid_batches(make_batches, datasets[1]) if t.eval_fixed_samples else None
        evaluator = Evaluator(
            steps, valid_batches, t.eval_interval, t.eval_iters, loggers, restart=restart
        )
        peak = peak_tflops(cfg.precision.dtype, cfg.logging.peak_theoretical_tflops)
        monitor = TrainMonitor(
            work.tokens, work.flops_per_token, topology.world_size, peak, train_iters
        )
        callbacks = _callbacks(
            cfg,
            monitor=monitor,
            loggers=loggers,
            evaluator=evaluator,
            io=io,
            parts=parts,
            guard=guard,
            rank=rank,
            train_iters=train_iters,
        )
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
            facts={**facts, "train_samples": train_samples},
            curriculum=curriculum,
        )
        loop.stop.install()
        try:
            stopped = loop.run()
        finally:
            loop.stop.uninstall()
        result = TrainResult(state.iteration, loop.losses, stopped=stopped)
        if not stopped:
            if not evaluator.due(state.iteration):
                evaluator.run(state.iteration)
            result.valid = evaluator.last
            if t.do_test:
                result.test = evaluator.run(state.iteration, "test", make_batches(datasets[2], 0))
        seconds = monitor.clock() - monitor.start
        summary = final_summary(
            cfg,
            result,
            started_at=started_at,
            train_iters=train_iters,
            seconds=seconds,
            tokens=monitor.tokens_trained,
        )
        loggers.log_text(summary)
    finally:
        loggers.close()
    return result
