"""What the memory and step-time plan assumes about the machine (`cfg.planning`).

`deepy.py --dry-run` and `tools/plan.py` print, before launch, what each rank of each pipeline
stage will hold and how long a step should take (`megatron/planning/`). These keys name the
GPU the plan is for and the figures of the machine it cannot know; none changes training.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron.config.schema import ConfigError


@dataclass(frozen=True)
class PlanningConfig:
    plan_gpu: str | None = None
    """The GPU to plan for, by a name of the plan's table (`H100`, `H200`, `A100-40GB`,
    `A100-80GB`, `L40S`, ...; `python tools/plan.py --gpus` lists them): its memory, dense
    peak TFLOP/s and NVLink bandwidth. Null: the GPU of the machine that plans, if any."""

    gpu_memory_gib: float | None = None
    """Memory of one GPU in GiB, instead of the table's (`plan_gpu`) or the detected one's."""

    plan_mfu: float = 0.4
    """The fraction of the dense peak (model FLOPs utilisation) the step-time estimate
    assumes the matrix work runs at."""

    plan_nvlink_gb_per_s: float | None = None
    """Bandwidth in GB/s (one direction, per GPU) between the GPUs of one node, for the
    collectives of the ranks a node holds. Null: the table's figure for `plan_gpu`."""

    plan_network_gb_per_s: float = 25.0
    """Bandwidth in GB/s (one direction, per GPU) between nodes: 25 is one 200 Gb/s
    InfiniBand HDR link per GPU; 50 for NDR."""

    plan_gpus_per_node: int | None = None
    """GPUs per node, which decides the collectives that leave a node. Null: `num_gpus`
    where set, else 8."""


def validate_planning(p: PlanningConfig, sources: dict[str, str]) -> None:
    """Positive figures, and an MFU that is a fraction."""
    for key in ("gpu_memory_gib", "plan_nvlink_gb_per_s", "plan_network_gb_per_s"):
        value = getattr(p, key)
        if value is not None and value <= 0:
            where = f" ({sources[key]})" if sources.get(key) else ""
            raise ConfigError(f"{key} {value!r}{where} must be a positive number")
    if not 0 < p.plan_mfu <= 1:
        raise ConfigError(f"plan_mfu {p.plan_mfu!r} must be in (0, 1]: a fraction of the peak")
    if p.plan_gpus_per_node is not None and p.plan_gpus_per_node < 1:
        raise ConfigError(f"plan_gpus_per_node {p.plan_gpus_per_node!r} must be at least 1")
