"""Model, optimizer and LR schedule handed to `deepspeed.initialize`.

Every optimizer is built here (`optimizers.py`), never by DeepSpeed, so the `optimizer`
section of the exported DeepSpeed config is dropped. The pipeline engine gets a
`PipelineModule` (its topology carries the groups); the plain engine gets the `GPTModel` and
the `ParallelTopology` as `mpu`. Under ZeRO-3 the model is built partitioned
(`model.py`). Parameters marked `keep_fp32` stay fp32 through the engine's cast to fp16/bf16,
in optimizer groups of their own, with fp32 gradients under ZeRO 1/2 (`fp32_params.py`).
While DeepSpeed wraps the optimizer, the optimizer does not step (`no_step`).
After `deepspeed.initialize`: the ZeRO-0 wrapper's step with one read and the true gradient
norm, fp16 loss scaling as configured (`fp16_scaler.py`), the bf16 wrapper's clipping on the
device and the ZeRO wrappers' checks read with the step's one flag (`grad_norm.py`), and a
check that an optimizer which needs whole parameters got them.
With one data-parallel replica and no ZeRO, DeepSpeed's gradient "all-reduce" is switched off
(`skip_single_replica_reduction`): it would flatten every gradient into one buffer, reduce it
over a group of one, scale it by 1/1 and copy it back, four passes over all gradients per step
that change nothing.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import torch

from megatron.config.verbosity import quiet_deepspeed, verbose_logging
from megatron.training.optim import Distro, OneBitAdam
from megatron.training.optim.lr.schedule import AnnealingLR, build_lr_scheduler
from megatron.training.optim.optimizers import build_optimizer_from_config, check_parameter_shapes
from megatron.training.setup.model import build_model_for_engine
from megatron.training.step.bf16_wrapper import fuse_hp_grad_updates
from megatron.training.step.fp16_scaler import install_loss_scaler, step_on_device
from megatron.training.step.fp32_params import (
    check_fp32_params,
    keep_zero_fp32_grads,
    reduce_fp32_grads_in_fp32,
    uncast_fp32_params,
)
from megatron.training.step.grad_norm import (
    STEP_GRAD_NORM,
    clip_bf16_on_device,
    clip_by_global_norm,
    zero_checks_on_device,
)
from megatron.training.step.moe_grads import (
    install_expert_grad_reduction,
    register_expert_groups,
    zero_partitions_experts,
)

log = logging.getLogger(__name__)


@dataclass
class EngineParts:
    engine: Any
    model: torch.nn.Module
    optimizer: Any
    lr_scheduler: AnnealingLR
    ds_config: dict


def build_engine(cfg, topology, train_iters: int, objective=None) -> EngineParts:
    """Build the model (seeded by the caller), optimizer, scheduler and DeepSpeed engine;
    the model's `loss_fn` is `objective`'s (`objectives/`; None: the language-model loss)."""
    import deepspeed

    from megatron.config import deepspeed_config
    from megatron.config.ds_export import pipeline_overlap_comm
    from megatron.parallel import model_parallel_seed

    ds_config = deepspeed_config(cfg, verbose=verbose_logging())
    if pipeline_overlap_comm(cfg):
        log.info(
            "zero_optimization.overlap_comm: off; DeepSpeed's pipeline engine reduces the "
            "gradients after the backward, never during it"
        )
    model = build_model_for_engine(cfg, topology, ds_config)
    if objective is not None:
        objective.install(model)
    model_parallel_seed(cfg.training.seed, topology)
    optimizer, _ = build_optimizer_from_config(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer, train_iters)
    pipeline = cfg.parallel.pipe_parallel_size >= 1
    register_expert_groups(topology)  # before initialize: it broadcasts experts over them
    # quiet: DeepSpeed's bf16 optimizer prints its memory use (`MA ... Max_MA ...`) as it builds
    with (
        zero_partitions_experts(cfg.parallel.zero_stage),
        uncast_fp32_params(model),
        quiet_deepspeed(),
        no_step(optimizer),
    ):
        engine, _, _, _ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=ds_config,
            mpu=None if pipeline else topology,
        )
    check_parameter_shapes(cfg.optimizer.optimizer_type, optimizer, model)
    check_fp32_params(engine)
    keep_zero_fp32_grads(engine.optimizer)
    reduce_fp32_grads_in_fp32(engine)
    if isinstance(optimizer, OneBitAdam | Distro):  # they replace the gradient all-reduce
        optimizer.attach_engine(engine, topology.dp_group)
    else:
        skip_single_replica_reduction(engine, topology)
    step_on_device(engine.optimizer, topology)  # before the loss scaler wraps the step
    install_loss_scaler(engine)
    clip_bf16_on_device(engine.optimizer)
    fuse_hp_grad_updates(engine.optimizer)
    free_last_stage_outputs(engine)
    zero_checks_on_device(engine.optimizer)
    install_expert_grad_reduction(engine, model, topology)
    use_global_norm_clipping(engine, topology)
    return EngineParts(engine, model, optimizer, scheduler, ds_config)


@contextlib.contextmanager
def no_step(optimizer):
    """`optimizer.step` does nothing inside (for `deepspeed.initialize`).

    DeepSpeed's `FP16_UnfusedOptimizer` (fp16 at ZeRO 0, bf16 at ZeRO 0 on the plain engine)
    steps the optimizer it wraps once over zero gradients to create its state. Adam's step
    count then starts at 1, so every later update has another bias correction, and a decoupled
    weight decay shrinks the fp32 master weights once where the LR is not 0 at step 0: the same
    config trained differently on the pipeline engine's `BF16_Optimizer` or under ZeRO, which
    step only on gradients. The optimizers create their state on their first real step.
    """
    own = optimizer.__dict__.get("step")  # an instance-level wrapper, if any
    optimizer.step = lambda *args, **kwargs: None  # shadows the method while DeepSpeed wraps
    try:
        yield optimizer
    finally:
        if own is None:
            del optimizer.step
        else:
            optimizer.step = own


def free_last_stage_outputs(engine) -> None:
    """The last pipeline stage lets go of a micro-batch's output (its logits) after the
    backward, as the other stages do.

    DeepSpeed 0.19.8's `PipelineEngine._exec_backward_pass` returns early on the last stage,
    before it clears `pipe_buffers["outputs"]`, so every buffer (at least two) kept its
    micro-batch's logits until its next forward: two tokens x vocabulary tensors held through
    the step, the optimizer step and the next forward (1.6 GB at 160M, micro batch 4, bf16).
    The engine dispatches instructions through its class's `_INSTRUCTION_MAP`; this engine
    gets its own, whose backward frees the buffer afterwards."""
    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.pipe.engine import PipelineEngine

    if not isinstance(engine, PipelineEngine) or not engine.is_last_stage():
        return
    backward = type(engine)._INSTRUCTION_MAP[schedule.BackwardPass]

    def backward_then_free(self, buffer_id):
        backward(self, buffer_id)
        self.pipe_buffers["outputs"][buffer_id] = None

    engine._INSTRUCTION_MAP = {**engine._INSTRUCTION_MAP, schedule.BackwardPass: backward_then_free}


def skip_single_replica_reduction(engine, topology) -> None:
    """No data-parallel gradient reduction where there is one replica and no ZeRO: the
    reduction would be the identity (DeepSpeed's data-parallel group is ours, of size 1)."""
    if topology.dp_size == 1 and engine.zero_optimization_stage() == 0:
        engine.buffered_allreduce_fallback = lambda *args, **kwargs: None


def use_global_norm_clipping(engine, topology) -> None:
    """Clip fp32 gradients without ZeRO by the true global norm, and keep that norm.

    DeepSpeed's own fp32 clipping neither sums the norm over pipeline stages nor reports it
    (see `grad_norm.py`); its fp16/bf16/ZeRO optimizers do both and are left alone. This
    replaces that one method of this engine.
    """

    def clip_and_record():
        known = engine.__dict__.pop(STEP_GRAD_NORM, None)  # the non-finite check's, this step
        engine._global_grad_norm = clip_by_global_norm(
            engine.module.parameters(), engine.gradient_clipping(), topology, norm=known
        )

    engine.clip_fp32_gradients = clip_and_record
