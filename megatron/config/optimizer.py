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
)


@dataclass(frozen=True)
class OptimizerConfig:
    optimizer: dict[str, Any] | None = None
    """`{type, params}` as in GPT-NeoX: type is one of Adam, AdamW, OneBitAdam, CPU_Adam,
    CPU_torch_adam, SM3, madgrad_wd, Lion, SGD; params holds `lr`, `betas`, `eps`, ... ."""

    lr: float | None = None
    """Peak learning rate; by default taken from `optimizer.params.lr`."""

    weight_decay: float = 0.01
    """Decoupled weight decay; never applied to biases and norm weights."""

    gradient_clipping: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""

    optimizer_type: str = derived("Adam")
    """Canonical optimizer type name (derived from `optimizer.type`)."""

    optimizer_params: dict[str, Any] = derived(None)
    """Optimizer parameters without `lr` (derived from `optimizer.params`)."""
