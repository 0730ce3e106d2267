"""Parallel layout and ZeRO settings (`cfg.parallel`), and what hybrid sharding (ZeRO++ hpZ)
may be combined with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from megatron.config.schema import ConfigError, derived


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
    `allgather_bucket_size`, `overlap_comm`, `offload_optimizer`, ...). With stage 3,
    `zero_hpz_partition_size: N` shards hybridly (ZeRO++ hpZ): after each forward pass every
    parameter is kept partitioned over groups of N consecutive ranks (a node's GPUs) and
    replicated across the groups, so the backward pass gathers weights within a group only.
    `overlap_comm` is passed as false to the pipeline engine (`pipe_parallel_size` >= 1),
    which reduces the gradients after the backward, never during it."""

    zero_allow_untested_optimizer: bool = False
    """Allow ZeRO with an optimizer DeepSpeed has not tested with it."""

    distributed_backend: Literal["nccl", "gloo", "mpi", "ccl"] = "nccl"
    """torch.distributed backend; without a GPU, gloo is used whatever this says (silently: the
    start-up report names the backend in use)."""

    distributed_timeout_minutes: float = 10.0
    """Collective timeout in minutes (Megatron-LM's key and default): a rank waiting this long
    for a dead or hung peer fails instead of hanging (DeepSpeed's own default is 30)."""

    world_size: int | None = derived()
    """Number of ranks of the run (derived from the launcher settings)."""

    data_parallel_size: int | None = derived()
    """world_size / (pipeline stages × model_parallel_size) (derived)."""

    zero_stage: int = derived(0)
    """ZeRO stage taken from `zero_optimization` (derived)."""


def hpz_partition_size(zero_optimization: dict[str, Any] | None) -> int:
    """ZeRO++ hpZ group size of a `zero_optimization` section (1: off)."""
    return int((zero_optimization or {}).get("zero_hpz_partition_size", 1) or 1)


def validate_hpz(p: ParallelConfig, sources: dict[str, str]) -> None:
    """hpZ only where DeepSpeed 0.19 builds it right: ZeRO-3 on the plain engine, data-parallel
    ranks only (its groups are consecutive global ranks), a group size dividing them."""
    raw = (p.zero_optimization or {}).get("zero_hpz_partition_size", 1)
    where = (
        f" (zero_optimization in {sources['zero_optimization']})"
        if sources.get("zero_optimization")
        else ""
    )
    key = f"zero_optimization.zero_hpz_partition_size {raw!r}{where}"
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ConfigError(
            f"{key} must be a whole number: 0 or 1 for no hybrid sharding, N > 1 for groups "
            "of N ranks"
        )
    size = hpz_partition_size(p.zero_optimization)
    if size <= 1:
        return
    if p.zero_stage != 3:
        raise ConfigError(
            f"{key} partitions ZeRO-3's parameters, but zero_optimization.stage is "
            f"{p.zero_stage}; set stage: 3, or remove zero_hpz_partition_size"
        )
    if p.pipe_parallel_size >= 1:
        raise ConfigError(
            f"{key} needs the plain engine (DeepSpeed's pipeline engine has no ZeRO-3); set "
            "pipe_parallel_size: 0"
        )
    if p.model_parallel_size > 1:
        raise ConfigError(
            f"{key} with model_parallel_size {p.model_parallel_size}: DeepSpeed 0.19 forms the "
            "hpZ groups from consecutive global ranks, which are tensor-parallel peers here, "
            "not data-parallel replicas; use model_parallel_size: 1 with hpZ"
        )
    dp = p.data_parallel_size
    if dp is not None and (size > dp or dp % size):
        raise ConfigError(
            f"{key} does not divide the data-parallel size {dp}; use a divisor of {dp} "
            "(usually the GPUs per node)"
        )
