"""Parallel layout and ZeRO settings (`cfg.parallel`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from megatron.config.schema import derived


@dataclass(frozen=True)
class ParallelConfig:
    pipe_parallel_size: int = 0
    """Pipeline stages. 0 builds a plain module for DeepSpeed's ordinary engine (required for
    ZeRO stage 2 and 3); 1 or more uses DeepSpeed's pipeline engine with that many stages."""

    model_parallel_size: int = 1
    """Tensor-parallel size (Megatron model parallelism): ranks that split each layer."""

    sequence_parallel: bool = False
    """Shard norm and dropout regions along the sequence across tensor-parallel ranks."""

    pipe_partition_method: str = "type:transformer|mlp"
    """How layers are assigned to pipeline stages: `type:transformer` (balance transformer
    layers), `parameters` (balance parameter counts) or `uniform` (balance layer count)."""

    zero_optimization: dict[str, Any] | None = None
    """DeepSpeed ZeRO settings, passed through as DeepSpeed writes them (`stage`,
    `allgather_bucket_size`, `overlap_comm`, `offload_optimizer`, ...)."""

    zero_allow_untested_optimizer: bool = False
    """Allow ZeRO with an optimizer DeepSpeed has not tested with it."""

    distributed_backend: Literal["nccl", "gloo", "mpi", "ccl"] = "nccl"
    """torch.distributed backend; without a GPU, gloo is used whatever this says."""

    distributed_timeout_minutes: float = 10.0
    """Collective timeout in minutes (Megatron-LM's key and default): a rank waiting this long
    for a dead or hung peer fails instead of hanging (DeepSpeed's own default is 30)."""

    world_size: int | None = derived()
    """Number of ranks of the run (derived from the launcher settings)."""

    data_parallel_size: int | None = derived()
    """world_size / (pipeline stages × model_parallel_size) (derived)."""

    zero_stage: int = derived(0)
    """ZeRO stage taken from `zero_optimization` (derived)."""
