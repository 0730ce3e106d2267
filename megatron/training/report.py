"""The start-up report: model size and FLOPs, parallel layout, batch arithmetic, data sizes."""

from __future__ import annotations


def _num(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:g}"


def startup_report(
    cfg,
    topology,
    *,
    parameters: int,
    flops_per_token: float,
    train_iters: int,
    dataset_sizes: dict[str, int | None],
    resumed_from: int = 0,
) -> str:
    """Lines printed once by rank 0 before training."""
    t, m, p = cfg.training, cfg.model, cfg.parallel
    tokens_per_step = t.train_batch_size * m.seq_length
    data = ", ".join(
        f"{name} {size:,} samples" if size is not None else f"{name} none"
        for name, size in dataset_sizes.items()
    )
    return "\n".join(
        [
            "start-up report",
            f"  model: {parameters:,} parameters ({_num(parameters)}), {m.num_layers} layers, "
            f"hidden {m.hidden_size}, {m.num_attention_heads} heads, seq {m.seq_length}, "
            f"vocab {m.padded_vocab_size}",
            f"  FLOPs per token (training, model FLOPs): {_num(flops_per_token)}; per step "
            f"{_num(flops_per_token * tokens_per_step)}",
            f"  layout: world {topology.world_size} = data {topology.dp_size} × pipeline "
            f"{p.pipe_parallel_size or 1} ({'pipeline engine' if p.pipe_parallel_size else 'plain engine'})"  # noqa: E501
            f" × tensor {topology.tp_size}; ZeRO stage {p.zero_stage}; precision "
            f"{cfg.precision.dtype}; optimizer {cfg.optimizer.optimizer_type}",
            f"  batch: global {t.train_batch_size} = micro {t.train_micro_batch_size_per_gpu} "
            f"× accumulation {t.gradient_accumulation_steps} × data-parallel {topology.dp_size}"
            f" = {tokens_per_step:,} tokens per step",
            f"  schedule: {train_iters} iterations ({_num(train_iters * tokens_per_step)} "
            f"tokens), starting at {resumed_from}",
            f"  data: {data}",
        ]
    )
