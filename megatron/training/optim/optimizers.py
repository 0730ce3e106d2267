"""Build the optimizer of a run from `cfg.optimizer`.

Each `optimizer.type` has one builder class in `OPTIMIZERS` (the facts of each type:
`megatron/config/groups/optimizer.py::OPTIMIZER_TYPES`, whose names a test keeps equal). Weight
decay is decoupled where the optimizer supports it and applies only to parameters of two or more
dimensions: biases, norm weights and other vectors are never decayed (`param_groups`).

`OneBitAdam` is our own (`megatron/training/optim/onebit_adam.py`): DeepSpeed 0.19 no longer
ships it. After `deepspeed.initialize`, call `optimizer.attach_engine(engine, dp_group)` so it
can switch the engine's gradient all-reduce off once its warm-up (`freeze_step`) is over.
`Distro` (DeMo, `megatron/training/optim/distro.py`) is attached the same way and switches it
off from the start: it exchanges compressed momenta instead.

GPT-NeoX compatibility: `Adam` and `AdamW` are both Adam with decoupled weight decay (NeoX's
`Adam` is apex/DeepSpeed FusedAdam in AdamW mode); `CPU_torch_adam` is `torch.optim.Adam`
(L2 weight decay) and `SGD` is `torch.optim.SGD` (L2 weight decay), as in NeoX.
"""

from __future__ import annotations

from typing import Any

import torch

from megatron.config.groups.optimizer import OPTIMIZER_TYPES
from megatron.model.mup import split_groups
from megatron.model.param_groups import param_groups
from megatron.training.optim.distro import Distro
from megatron.training.optim.lion import Lion
from megatron.training.optim.madgrad import MADGRAD
from megatron.training.optim.onebit_adam import OneBitAdam
from megatron.training.optim.sm3 import SM3
from megatron.training.step.moe_grads import expert_param_groups


def _fused_by_default() -> bool:
    """Whether torch's fused AdamW kernel is the default: on a CUDA accelerator.

    The plain engine's optimizer is built before `deepspeed.initialize` moves the model to the
    accelerator, so where the parameters are now says nothing of where they will step; the
    engine places them (and DeepSpeed its fp32 copies and partitions) on DeepSpeed's
    accelerator. torch fuses AdamW on the CPU too, so a ZeRO CPU offload steps fused as well.
    """
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name() == "cuda"


class OptimizerBuilder:
    """Makes one optimizer type from parameter groups, the peak LR and `optimizer.params`."""

    def build(self, groups, lr: float, weight_decay: float, params: dict[str, Any]):
        raise NotImplementedError


class TorchAdamW(OptimizerBuilder):
    """torch.optim.AdamW; the fused kernel on a CUDA accelerator (`params.fused` overrides)."""

    def build(self, groups, lr, weight_decay, params):
        fused = params.pop("fused", _fused_by_default())
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, fused=fused, **params)


class TorchAdamL2(OptimizerBuilder):
    """torch.optim.Adam (L2 weight decay), NeoX's `cpu_torch_adam`."""

    def build(self, groups, lr, weight_decay, params):
        return torch.optim.Adam(groups, lr=lr, weight_decay=weight_decay, **params)


class DeepSpeedCPUAdam(OptimizerBuilder):
    """DeepSpeed's vectorised C++ Adam (JIT-built on first use), in AdamW mode."""

    def build(self, groups, lr, weight_decay, params):
        from deepspeed.ops.adam import DeepSpeedCPUAdam as CPUAdam

        params.setdefault("adamw_mode", True)
        return CPUAdam(groups, lr=lr, weight_decay=weight_decay, **params)


class Plain(OptimizerBuilder):
    """An optimizer class called as `cls(groups, lr=, weight_decay=, **params)`."""

    def __init__(self, cls):
        self.cls = cls

    def build(self, groups, lr, weight_decay, params):
        return self.cls(groups, lr=lr, weight_decay=weight_decay, **params)


class DistroBuilder(OptimizerBuilder):
    """DisTrO/DeMo (`optim/distro.py`). Psyche's `clip_grad_norm` and `weight_decay` may stand in
    its params; resolution has checked that they equal `gradient_clipping` and `weight_decay`
    (`megatron/config/checks/optimizer_engines.py`), which are what clips and decays."""

    def build(self, groups, lr, weight_decay, params):
        params.pop("clip_grad_norm", None)
        params.pop("weight_decay", None)
        return Distro(groups, lr=lr, weight_decay=weight_decay, **params)


OPTIMIZERS: dict[str, OptimizerBuilder] = {
    "Adam": TorchAdamW(),
    "AdamW": TorchAdamW(),
    "CPU_Adam": DeepSpeedCPUAdam(),
    "CPU_torch_adam": TorchAdamL2(),
    "Distro": DistroBuilder(),
    "OneBitAdam": Plain(OneBitAdam),
    "Lion": Plain(Lion),
    "SGD": Plain(torch.optim.SGD),
    "SM3": Plain(SM3),
    "madgrad_wd": Plain(MADGRAD),
}


def build_optimizer(
    groups: list[dict[str, Any]],
    optimizer_type: str,
    lr: float,
    weight_decay: float = 0.0,
    params: dict[str, Any] | None = None,
):
    """The optimizer over `groups`.

    `weight_decay` is the default of groups that set none (`param_groups` sets both).
    """
    builder = OPTIMIZERS.get(optimizer_type)
    if builder is None:
        raise ValueError(
            f"optimizer.type '{optimizer_type}' is not valid; expected one of "
            f"{', '.join(OPTIMIZERS)}"
        )
    params = dict(params or {})
    if "betas" in params:
        params["betas"] = tuple(params["betas"])  # YAML gives lists
    try:
        return builder.build(groups, float(lr), float(weight_decay), params)
    except TypeError as err:  # an unknown keyword in optimizer.params
        raise ValueError(
            f"optimizer.params {sorted(params)} do not fit optimizer.type '{optimizer_type}': {err}"
        ) from err


def optimizer_groups(cfg, model: torch.nn.Module) -> list[dict[str, Any]]:
    """The parameter groups `cfg`'s optimizer gets: weight decay or not, fp32 groups in an
    fp16/bf16 run (`param_groups`), muP's per-width LR, DeepSpeed's expert groups under ZeRO 1/2."""
    half = cfg.precision.dtype != "fp32"
    groups = param_groups(model, cfg.optimizer.weight_decay, fp32_groups=half)
    if cfg.mup.use_mup:
        groups = split_groups(groups, cfg.optimizer.optimizer_type)
    return expert_param_groups(groups, cfg.parallel.zero_stage)


def build_optimizer_from_config(cfg, model: torch.nn.Module):
    """(optimizer, parameter groups) for `deepspeed.initialize`."""
    o = cfg.optimizer
    groups = optimizer_groups(cfg, model)
    optimizer = build_optimizer(
        groups, o.optimizer_type, o.lr, o.weight_decay, o.optimizer_params or {}
    )
    return optimizer, groups


def check_parameter_shapes(optimizer_type: str, optimizer, model: torch.nn.Module) -> None:
    """After `deepspeed.initialize`: an optimizer that needs whole parameters
    (`OptimizerType.whole_parameter`) must step over tensors shaped like the model's
    parameters.

    DeepSpeed swaps the optimizer's parameters for its own tensors (fp32 copies, or flat
    partitions); resolution refuses the flattening combinations, and this catches any other
    (a DeepSpeed upgrade, a pass-through setting) before the first step.
    """
    why = OPTIMIZER_TYPES[optimizer_type].whole_parameter
    if not why:
        return
    stepped = sorted(tuple(p.shape) for g in optimizer.param_groups for p in g["params"])
    expected = sorted(
        tuple(getattr(p, "ds_shape", p.shape)) for p in model.parameters() if p.requires_grad
    )
    if stepped != expected:
        raise RuntimeError(
            f"optimizer {optimizer_type} would step over tensors of shapes {stepped[:4]}... "
            f"instead of the model's parameters {expected[:4]}...: DeepSpeed flattened them "
            f"and {optimizer_type} {why}. Use ZeRO stage "
            "0 (with bf16 the plain engine, pipe_parallel_size: 0) or another optimizer"
        )
