"""Model-parallel RNG: which ranks share dropout masks, kept through activation checkpointing.

Two random streams per rank:

- the default generator (`torch.manual_seed`): dropout in replicated regions (embedding,
  residual/hidden dropout after a row-parallel layer). Tensor-parallel ranks hold identical
  copies of these activations, so they MUST draw identical masks (else the copies diverge); data
  parallel replicas and pipeline stages draw different ones.
- the tracked "model-parallel-rng" state, entered with `get_rng_tracker().fork()`: dropout
  inside the tensor-parallel region (attention probabilities of this rank's heads, a sharded
  MLP activation). Every rank draws a different mask, tp ranks included, since each holds a
  different slice.

Seeds, for replica index `i = dp_rank * pp_size + pp_rank` (`seed` itself on rank 0, so a
single process seeded with `seed` draws what `torch.manual_seed(seed)` would):

    default         = seed + 1_000_003 * i
    tensor parallel = default + 2718 + tp_rank

All seeds in a job are distinct. The tracker is DeepSpeed's own
(`deepspeed.runtime.activation_checkpointing.checkpointing.get_cuda_rng_tracker()`), because
DeepSpeed activation checkpointing saves and restores exactly that tracker (with the default
generator) around recomputation: dropout replayed in backward then draws the forward's masks,
on GPU and, with `DS_ACCELERATOR=cpu`, on CPU. The tracker forks the generator of DeepSpeed's
accelerator only, so activations must live on that device (CPU tensors on a CUDA machine would
draw from the default stream inside `fork()`).

Order at start-up: seed the default generator with `seed` on every rank (`seed_everything`,
which seeds Python and NumPy too) and build the model (every rank then draws the same full
weights, see `params.sharded_parameter`), then call `model_parallel_seed(seed, topology)`
before training. Leave `PipelineModule(seed_layers=...)`
off: it re-seeds the default generator before every layer's forward with the same seed on all
data-parallel ranks, which would undo the per-replica dropout seeds.
"""

from __future__ import annotations

import numbers
import random
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch
from deepspeed.runtime.activation_checkpointing import checkpointing

#: Name of the tracked tensor-parallel state (DeepSpeed's default for `fork()`).
MODEL_PARALLEL_RNG = "model-parallel-rng"

_REPLICA_SEED_STRIDE = 1_000_003  # > 2718 + any tp size: replica seed ranges never overlap
_TP_SEED_OFFSET = 2718  # Megatron's and DeepSpeed's offset of the tensor-parallel seed


@dataclass(frozen=True)
class RngSeeds:
    """The two seeds of one rank: `default` (shared by its tp group) and `tensor_parallel`."""

    default: int
    tensor_parallel: int


def rng_seeds(seed: int, topology) -> RngSeeds:
    """The seeds `model_parallel_seed` uses on the rank described by `topology`."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    replica = topology.dp_rank * topology.pp_size + topology.pp_rank
    default = seed + _REPLICA_SEED_STRIDE * replica
    return RngSeeds(default=default, tensor_parallel=default + _TP_SEED_OFFSET + topology.tp_rank)


def get_rng_tracker():
    """The tracker of tensor-parallel RNG states (DeepSpeed's, see the module docstring).

    `with get_rng_tracker().fork(): y = dropout(x)` draws from the tensor-parallel state.
    """
    return checkpointing.get_cuda_rng_tracker()


def model_parallel_seed(seed: int, topology) -> RngSeeds:
    """Seed the default generator and the tensor-parallel tracker state for this rank.

    Resets the tracker (so it may be called again, e.g. in tests). Returns the seeds used.
    """
    seeds = rng_seeds(seed, topology)
    tracker = get_rng_tracker()
    tracker.reset()
    torch.manual_seed(seeds.default)  # the CPU generator and every CUDA device's
    tracker.add(MODEL_PARALLEL_RNG, seeds.tensor_parallel)
    return seeds


def tensor_parallel_rng() -> AbstractContextManager:
    """Shorthand for `get_rng_tracker().fork(MODEL_PARALLEL_RNG)`."""
    return get_rng_tracker().fork(MODEL_PARALLEL_RNG)


def seed_everything(seed: int) -> None:
    """The same seed on every rank: Python, NumPy and torch (so every rank builds the same
    full weights)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
