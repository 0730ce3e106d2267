"""Model, optimizer and LR schedule handed to `deepspeed.initialize`.

Every optimizer is built here (`optimizers.py`), never by DeepSpeed, so the `optimizer`
section of the exported DeepSpeed config is dropped. The pipeline engine gets a
`PipelineModule` (its topology carries the groups); the plain engine gets the `GPTModel` and
the `ParallelTopology` as `mpu`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from megatron.training.lr_schedules import AnnealingLR, build_lr_scheduler
from megatron.training.optim import OneBitAdam
from megatron.training.optimizers import build_optimizer_from_config


@dataclass
class EngineParts:
    engine: Any
    model: torch.nn.Module
    optimizer: Any
    lr_scheduler: AnnealingLR
    ds_config: dict


def exported_deepspeed_config(cfg) -> dict:
    """`megatron.config.deepspeed_config(cfg)` without an `optimizer` section (ours)."""
    from megatron.config import deepspeed_config

    ds = deepspeed_config(cfg)
    ds.pop("optimizer", None)
    return ds


def build_engine(cfg, topology, train_iters: int) -> EngineParts:
    """Build the model (seeded by the caller), optimizer, scheduler and DeepSpeed engine."""
    import deepspeed

    from megatron.model import build_model
    from megatron.parallel import model_parallel_seed

    model = build_model(cfg, topology)
    model_parallel_seed(cfg.training.seed, topology)
    optimizer, _ = build_optimizer_from_config(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer, train_iters)
    ds_config = exported_deepspeed_config(cfg)
    pipeline = cfg.parallel.pipe_parallel_size >= 1
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=ds_config,
        mpu=None if pipeline else topology,
    )
    if isinstance(optimizer, OneBitAdam):
        optimizer.attach_engine(engine, topology.dp_group)
    record_fp32_grad_norm(engine)
    return EngineParts(engine, model, optimizer, scheduler, ds_config)


def record_fp32_grad_norm(engine) -> None:
    """Keep the gradient norm DeepSpeed computes when clipping fp32 gradients without ZeRO.

    DeepSpeed's fp16/bf16/ZeRO optimizers report their norm through
    `get_global_grad_norm()`; its plain fp32 path clips and throws the norm away. This wraps
    that one method of this engine to store it (same arithmetic, same result).
    """
    from deepspeed.runtime.utils import clip_grad_norm_

    def clip_and_record():
        engine._global_grad_norm = clip_grad_norm_(
            parameters=engine.module.parameters(),
            max_norm=engine.gradient_clipping(),
            mpu=engine.mpu,
        )

    engine.clip_fp32_gradients = clip_and_record
