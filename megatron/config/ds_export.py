"""The DeepSpeed config dict of a resolved config."""

from __future__ import annotations

import copy
from typing import Any

from megatron.config.config import Config
from megatron.config.groups.deepspeed import PASSTHROUGH
from megatron.config.groups.precision import LOSS_SCALING_KEYS
from megatron.config.schema import ConfigError

# With sequence parallelism and several pipeline stages, the activations passed between stages
# are already split along the sequence over tensor-parallel ranks: DeepSpeed must not split
# (and later reassemble) them again as if they were replicated.
PIPELINE_SP_SECTION = {"pipe_partitioned": False, "grad_partitioned": False}

# DeepSpeed's throughput timer (on by default) synchronises the device at the start and the end
# of every micro-batch of the plain engine, for a samples/s figure it prints at `steps_per_print`
# and we do not use: the trainer's own monitor times whole steps without a synchronisation.
NO_THROUGHPUT_TIMER = {"throughput": {"enabled": False}}


# DeepSpeed's own progress print every `steps_per_print` steps (the pipeline engine's `steps: 100
# loss: 4.1234 iter time (s): ...`, the plain engine's `step=100, skipped=0, lr=...` INFO line)
# says what our iteration line says, with another loss (the step's, not the interval's mean),
# so it is shown only with `deepy.py --verbose`. DeepSpeed has no off switch (None fails in the
# pipeline engine's `wall_clock_breakdown`): the interval is one that no run reaches.
QUIET_STEPS_PER_PRINT = 2**63 - 1


# DeepSpeed's pipeline engine reduces the gradients after the last micro-batch's backward, never
# during it: given `overlap_comm`, its ZeRO 1 optimizer warns "Pipeline parallelism does not
# support overlapped communication, will be disabled." on every rank and turns it off, its bf16
# optimizer ignores it (and ZeRO 2 and 3 are refused with it). Most GPT-NeoX configs set it with
# pipe_parallel_size 1, so it is exported as what DeepSpeed does (a verbose worker says so).
def pipeline_overlap_comm(cfg: Config) -> bool:
    """Whether the config asks the pipeline engine for `overlap_comm`, which it never does."""
    zero = cfg.parallel.zero_optimization or {}
    return cfg.parallel.pipe_parallel_size >= 1 and bool(zero.get("overlap_comm"))


# bf16 at ZeRO 1 accumulates micro-batch gradients in fp32 on both engines: DeepSpeed 0.19 then
# wraps the optimizer in its BF16_Optimizer on either (without this the plain engine's ZeRO
# optimizer accumulated in bf16, and the same config trained differently at pipe_parallel_size 0
# and 1). At ZeRO 0 DeepSpeed accumulates in bf16 on both engines and refuses fp32 ("unsupported
# mix"); derive warns of it for the pipeline engine.
BF16_ZERO1_DATA_TYPES = {"grad_accum_dtype": "fp32"}


def deepspeed_config(cfg: Config, *, verbose: bool = False) -> dict[str, Any]:
    """Batch sizes, ZeRO, precision, clipping, logging, pass-through sections and extra args.

    No `optimizer` section: the trainer builds every optimizer itself (DeepSpeed 0.19 no longer
    ships 1-bit Adam) and hands it to `deepspeed.initialize`. `verbose` (a worker started with
    `deepy.py --verbose`): DeepSpeed prints its progress every `steps_per_print` steps, else
    never (`QUIET_STEPS_PER_PRINT`)."""
    t, p, pr = cfg.training, cfg.parallel, cfg.precision
    ds: dict[str, Any] = {
        "train_batch_size": t.train_batch_size,
        "train_micro_batch_size_per_gpu": t.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "gradient_clipping": cfg.optimizer.gradient_clipping,
        "steps_per_print": cfg.logging.steps_per_print if verbose else QUIET_STEPS_PER_PRINT,
        "wall_clock_breakdown": cfg.logging.wall_clock_breakdown,
        "zero_optimization": copy.deepcopy(p.zero_optimization or {"stage": 0}),
        "zero_allow_untested_optimizer": p.zero_allow_untested_optimizer,
    }
    if pipeline_overlap_comm(cfg):
        ds["zero_optimization"]["overlap_comm"] = False
    if pr.dtype == "fp16":
        # GPT-NeoX's configs repeat `"fp16": true` inside the section, and some say a `type`;
        # DeeperSpeed ignored both (derive_precision warns of a type other than fp16),
        # DeepSpeed 0.19 refuses a key its fp16 section does not know.
        section = {k: v for k, v in (pr.fp16 or {}).items() if k not in ("fp16", "type")}
        ds["fp16"] = {**section, "enabled": True}
    elif pr.dtype == "bf16":
        # Likewise `"bf16": true` and fp16's loss-scaling keys in a bf16 section: GPT-NeoX's
        # DeepSpeed ignored them there, and bf16 trains without loss scaling.
        dropped = ("bf16", *LOSS_SCALING_KEYS)
        section = {k: v for k, v in (pr.bf16 or {}).items() if k not in dropped}
        ds["bf16"] = {**section, "enabled": True}
        if p.zero_stage == 1 and cfg.deepspeed.data_types is None:
            ds["data_types"] = dict(BF16_ZERO1_DATA_TYPES)
    if p.sequence_parallel and p.pipe_parallel_size > 1:
        ds["pipeline"] = dict(PIPELINE_SP_SECTION)
    if pr.fp32_allreduce:
        ds["fp32_allreduce"] = True
    for key in PASSTHROUGH:
        value = getattr(cfg.deepspeed, key)
        if value is not None:
            ds[key] = copy.deepcopy(value)
    for key, value in (cfg.deepspeed.deepspeed_extra_args or {}).items():
        if key in ds:
            raise ConfigError(
                f"deepspeed_extra_args sets '{key}', which is already set from the config "
                f"(value {ds[key]!r}); set it in one place only"
            )
        ds[key] = copy.deepcopy(value)
    ds.setdefault("timers", copy.deepcopy(NO_THROUGHPUT_TIMER))  # unless a section sets one
    return ds
