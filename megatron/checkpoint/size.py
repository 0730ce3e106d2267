"""Bytes one checkpoint of a run takes on disk, from its config alone (no model built).

    size = checkpoint_size(cfg)          # CheckpointSize: parameters and bytes per part
    size.total                           # what one `global_step{N}` folder needs
    free_bytes_at(cfg.checkpointing.save)

Shared by `deepy.py`'s pre-flight (`megatron/preflight/disk.py`) and the run's check before
each save (`megatron/training/checkpoint/disk_space.py`), so both agree on what "room for a
checkpoint" means. What DeepSpeed 0.19 writes, summed over every rank (ZeRO changes how the
optimizer part is split between files, not its total):

- the weights in the run's dtype (2 bytes in bf16/fp16, 4 in fp32), written once (by the
  first data-parallel rank); not with ZeRO-3, whose module files hold empty placeholders;
- a 4-byte master copy when the weights are 16-bit (FP16_UnfusedOptimizer's `fp32_groups`,
  BF16_Optimizer's and ZeRO's fp32 partitions), and with ZeRO 1-3 also in fp32 (ZeRO keeps its
  fp32 partition as a tensor of its own);
- the optimizer's per-parameter states, 4 bytes each
  (`megatron/config/groups/optimizer.py::OptimizerType.saved_states`);
- neither of the last two with `no_save_optim`.

Parameters are `count_parameters` (tied weights once). Not counted: the trainer state, RNG
states, `config.json` and the archive headers (tens of kB per rank), and SM3's per-dimension
accumulators (a row and a column per matrix).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from megatron.config.groups.optimizer import OPTIMIZER_TYPES
from megatron.model.counting import count_parameters

FP32_BYTES = 4
WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class CheckpointSize:
    """One checkpoint's parameters and bytes, by part (see the module docstring)."""

    parameters: int
    weights: int
    master: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.master + self.optimizer


def checkpoint_size(cfg) -> CheckpointSize:
    """The size of one checkpoint of the run `cfg` (a resolved config) describes."""
    n = count_parameters(cfg)
    dtype, zero = cfg.precision.dtype, cfg.parallel.zero_stage
    weights = 0 if zero == 3 else n * WEIGHT_BYTES[dtype]
    if cfg.checkpointing.no_save_optim:
        return CheckpointSize(n, weights, 0, 0)
    master = n * FP32_BYTES if dtype != "fp32" or zero >= 1 else 0
    o = cfg.optimizer
    dp = cfg.parallel.data_parallel_size
    states = OPTIMIZER_TYPES[o.optimizer_type].saved_states(o.optimizer_params or {}, dp)
    return CheckpointSize(n, weights, master, n * FP32_BYTES * states)


def existing_ancestor(path: str | Path) -> Path:
    """`path` or its nearest parent that exists (where a missing folder would be created)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes_at(path: str | Path) -> int:
    """Free bytes (for this user) on the file system that `path`, or its parent, lives on."""
    return shutil.disk_usage(existing_ancestor(path)).free


def format_bytes(n: float) -> str:
    """`n` bytes as `1.2 GB` (powers of 1000, as `df -H` and disk vendors count)."""
    units = ("B", "kB", "MB", "GB", "TB", "PB")
    i = 0
    while abs(n) >= 1000 and i < len(units) - 1:
        n, i = n / 1000, i + 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"
