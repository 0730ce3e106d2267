"""Optimizer settings (`cfg.optimizer`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron.config.schema import derived

OPTIMIZER_TYPES = (
    "Adam",
    "AdamW",
    "OneBitAdam",
    "CPU_Adam",
    "CPU_torch_adam",
    "SM3",
    "madgrad_wd",
    "Lion",
    "SGD",
    "Distro",
)

# What GPT-NeoX trains with when a config has no `optimizer` section (its OPT_DEFAULT and
# OPT_PARAMS_DEFAULTS, the Adam entries): Adam, lr 1e-3, betas (0.9, 0.999), eps 1e-8. Weight
# decay comes from `weight_decay`, as for every optimizer here.
NEOX_DEFAULT_OPTIMIZER = "Adam"
NEOX_DEFAULT_LR = 1.0e-3
NEOX_DEFAULT_PARAMS: dict[str, Any] = {"betas": [0.9, 0.999], "eps": 1.0e-8}


@dataclass(frozen=True)
class OptimizerConfig:
    optimizer: dict[str, Any] | None = None
    """`{type, params}` as in GPT-NeoX: type is one of Adam, AdamW, OneBitAdam, CPU_Adam,
    CPU_torch_adam, SM3, madgrad_wd, Lion, SGD, Distro; params holds `lr`, `betas`, `eps`, ... .
    Distro (DisTrO/DeMo, Psyche's names) takes `compression_decay` (0.999),
    `compression_chunk` (64), `compression_topk` (8) and `quantize_1bit` (true); it replaces
    the data-parallel gradient all-reduce and needs fp32 and ZeRO stage 0.
    Without it (or without a type or lr in it), GPT-NeoX's default is used with a warning:
    Adam, lr 1e-3, betas [0.9, 0.999], eps 1e-8. SM3 and OneBitAdam need whole parameters:
    refused with ZeRO stages 1-3 and with bf16 on the pipeline engine, where DeepSpeed hands
    the optimizer flat partitions."""

    lr: float | None = None
    """Peak learning rate; by default taken from `optimizer.params.lr`."""

    weight_decay: float = 0.1
    """Decoupled weight decay (GPT-NeoX's default 0.1); never applied to biases and norm
    weights."""

    gradient_clipping: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""

    optimizer_type: str = derived("Adam")
    """Canonical optimizer type name (derived from `optimizer.type`)."""

    optimizer_params: dict[str, Any] = derived(None)
    """Optimizer parameters without `lr` (derived from `optimizer.params`)."""
