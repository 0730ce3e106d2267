"""The start-up report: model size and FLOPs, parallel layout, batch arithmetic, data sizes;
the run's start record for metrics.jsonl; the run summary."""

from __future__ import annotations

import datetime
import secrets

from megatron.config.groups.parallel import hpz_partition_size
from megatron.training.metrics.flops import StepWork, peak_description


def _num(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:g}"


def _hpz(p) -> str:
    size = hpz_partition_size(p.zero_optimization)
    return f" (hpZ: parameters partitioned within groups of {size} ranks)" if size > 1 else ""


def run_layout(cfg, topology) -> dict[str, int]:
    """The parallel layout a checkpoint records (`layout` in its trainer state): which rank
    holds which RNG streams depends on it."""
    return {
        "tp": topology.tp_size,
        "pp": cfg.parallel.pipe_parallel_size,
        "dp": topology.dp_size,
    }


def layout_change_notice(saved: dict | None, current: dict[str, int]) -> str | None:
    """The start-up line of a run resumed at another layout than its checkpoint's (None when
    the layout is the same, or the checkpoint predates the record). Each rank's dropout and
    other RNG streams belong to its place in the old layout, so they are not restored."""
    if not saved or all(saved.get(k) == v for k, v in current.items()):
        return None
    old = ",".join(str(saved.get(k, "?")) for k in current)
    new = ",".join(str(v) for v in current.values())
    return (
        f"layout changed from (tp,pp,dp)=({old}) to ({new}): dropout RNG streams restart from "
        "the seed; the run is not bitwise identical to an uninterrupted one (the data stream "
        "and the LR schedule continue where the checkpoint stopped)"
    )


def startup_report(
    cfg,
    topology,
    *,
    parameters: int,
    work: StepWork,
    train_iters: int,
    dataset_sizes: dict[str, int | None],
    resumed_from: int = 0,
    resumed_folder: str | None = None,
    layout_notice: str | None = None,
    backend: str | None = None,
) -> str:
    """Lines printed once by rank 0 before training (`work`: `flops.step_work`;
    `layout_notice`: see `layout_change_notice`; `backend`: the torch.distributed backend in
    use, which on a machine without a GPU is gloo whatever `distributed_backend` says)."""
    t, m, p = cfg.training, cfg.model, cfg.parallel
    tokens_per_step, pairs = work.tokens, work.sequences_per_sample == 2
    data = ", ".join(
        f"{name} {size:,} samples" if size is not None else f"{name} none"
        for name, size in dataset_sizes.items()
    )
    return "\n".join(
        [
            "start-up report",
            f"  model: {parameters:,} parameters ({_num(parameters)}), {m.num_layers} layers, "
            f"hidden {m.hidden_size}, {m.num_attention_heads} heads, seq {m.seq_length}, "
            f"vocab {m.padded_vocab_size}; {_head_and_loss(cfg)}",
            f"  FLOPs per token (model FLOPs): {_flops_per_token(work)}; per step "
            f"{_num(work.flops)}; "
            + peak_description(cfg.precision.dtype, cfg.logging.peak_theoretical_tflops),
            f"  layout: world {topology.world_size} = data {topology.dp_size} × pipeline "
            f"{p.pipe_parallel_size or 1} ({'pipeline engine' if p.pipe_parallel_size else 'plain engine'})"  # noqa: E501
            f" × tensor {topology.tp_size}; ZeRO stage {p.zero_stage}{_hpz(p)}; precision "
            f"{cfg.precision.dtype}; optimizer {cfg.optimizer.optimizer_type}"
            + (f"; backend {backend}" if backend else ""),
            f"  batch: global {t.train_batch_size}{' pairs' if pairs else ''} = micro "
            f"{t.train_micro_batch_size_per_gpu} "
            f"× accumulation {t.gradient_accumulation_steps} × data-parallel {topology.dp_size}"
            + (f" = {work.samples * 2} sequences (chosen and rejected)" if pairs else "")
            + f" = {tokens_per_step:,} tokens per step",
            f"  schedule: {train_iters} iterations ({_num(train_iters * tokens_per_step)} "
            f"tokens), starting at {resumed_from}",
            f"  data: {data}"
            + (" (synthetic tokens: data_impl dummy)" if cfg.data.data_impl == "dummy" else ""),
        ]
        + _validation_line(t, dataset_sizes.get("valid"))
        + (
            [f"  resuming from {resumed_folder} at iteration {resumed_from}"]
            if resumed_folder
            else []
        )
        + ([f"  resume: {layout_notice}"] if layout_notice else [])
    )


def _head_and_loss(cfg) -> str:
    """How the output head meets the loss (`loss_chunk_tokens`)."""
    m = cfg.model
    if getattr(cfg.post_training, "train_impl", None) == "rm":
        return "value head (train_impl: rm)"
    if m.loss_chunk_tokens:
        return f"head and loss fused, {m.loss_chunk_tokens} tokens a chunk (loss_chunk_tokens)"
    return "full logits (loss_chunk_tokens: 0)"


def _validation_line(t, valid_samples: int | None) -> list[str]:
    """Which validation samples each evaluation reads: the next ones (GPT-NeoX) or the same."""
    if not t.eval_interval or not t.eval_iters or not valid_samples:
        return []
    each = (
        "the same ones each time (eval_fixed_samples)"
        if t.eval_fixed_samples
        else "the next ones each time, so successive losses are on other samples "
        "(eval_fixed_samples: true reads the same)"
    )
    return [
        f"  validation: every {t.eval_interval} iterations, {t.eval_iters} batches × "
        f"{t.train_batch_size} = {t.eval_iters * t.train_batch_size:,} samples, {each}"
    ]


def run_start_record(
    cfg, *, started_at: int, resumed_from: str | None, train_iters: int, world_size: int
) -> dict:
    """The record a run writes first to metrics.jsonl (`loggers/jsonl.py` says why): where it
    starts (`iteration`, 0 unless resumed, and `resumed_from`, the checkpoint folder or None),
    an id of its own (start time and a random suffix: two runs may start in one second), the
    start time with its UTC offset, the length, the world size and the config files."""
    now = datetime.datetime.now().astimezone()
    return {
        "split": "run",
        "iteration": started_at,
        "resumed_from": resumed_from,
        "run_id": f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}",
        "start_time": now.isoformat(timespec="seconds"),
        "train_iters": train_iters,
        "world_size": world_size,
        "config_files": list(cfg.config_files),
    }


def _flops_per_token(work: StepWork) -> str:
    """The training FLOPs per token, and the reference model's forward apart when one runs."""
    training = f"training {_num(work.training_flops_per_token)}"
    if not work.reference_flops_per_token:
        return training
    share = work.reference_flops_per_token / work.flops_per_token
    return (
        f"{training} + reference model forward {_num(work.reference_flops_per_token)} "
        f"({share:.0%} of the step) = {_num(work.flops_per_token)}"
    )


def final_summary(
    cfg, result, *, started_at: int, train_iters: int, seconds: float, tokens: int
) -> str:
    """Lines printed once by rank 0 when training ends: where it stopped, the final losses,
    tokens and time of this run, and where the checkpoint and the logs are.

    `result` is pretrain's `TrainResult`; `started_at` the iteration the run resumed from;
    `seconds` the time since the first step (evaluations included); `tokens` those trained on
    since (`TrainMonitor.tokens_trained`).
    """
    from megatron.checkpoint.folders import read_latest
    from megatron.training.metrics.loggers.console import format_duration

    if result.stopped:
        status = f"stopped early at iteration {result.iteration} of {train_iters}"
    elif started_at >= train_iters:  # resumed a finished run: nothing trained
        status = (
            f"already complete at iteration {started_at} of {train_iters}: nothing to train "
            "(raise train_iters to continue it, or give a new run its own save/load folder)"
        )
    else:
        status = f"finished at iteration {result.iteration} of {train_iters}"
    losses = [f"train {result.losses[-1]:.4f} (last step)"] if result.losses else []
    for split, ev in (("valid", result.valid), ("test", result.test)):
        if ev is not None:
            ppl = f" (perplexity {ev.perplexity:.3f})" if ev.perplexity is not None else ""
            losses.append(f"{split} {ev.loss:.4f}{ppl}")
    speed = f" ({tokens / seconds:,.0f} tokens/s)" if seconds > 0 else ""
    save = cfg.checkpointing.save
    tag = read_latest(save) if save else None
    trained = [
        f"  final loss: {', '.join(losses) or '-'}",
        f"  tokens: {tokens:,} in {format_duration(seconds)}{speed}",
    ]
    return "\n".join(
        [
            "run summary",
            f"  {status}",
            *(trained if tokens or losses else []),
            f"  checkpoint: {f'{save}/{tag}' if tag else 'none (set save to keep one)'}",
            f"  logs: {_log_places(cfg.logging)}",
        ]
    )


def _log_places(lg) -> str:
    places = [f"{lg.log_dir}/metrics.jsonl" if lg.log_dir else "console only (no log_dir)"]
    if lg.tensorboard_dir:
        places.append(f"TensorBoard {lg.tensorboard_dir}")
    if lg.use_wandb:
        places.append(f"wandb project {lg.wandb_project}")
    if lg.use_comet:
        places.append(f"Comet project {lg.comet_project or 'Uncategorized Experiments'}")
    return ", ".join(places)
