"""The machine a plan is for: which device the traces stand for, one rank's memory, the peak
and the links (`cfg.planning`, `megatron/config/groups/planning.py`).

In order: `plan_gpu` (a GPU of the table, `gpus.py`; `gpu_memory_gib` and
`plan_nvlink_gb_per_s` override its figures), `gpu_memory_gib` alone (another GPU: its peak
from `peak_theoretical_tflops`), the GPU of this machine, else this machine's CPU: the run's
ranks there share its memory, and a CPU has no step-time estimate.
"""

from __future__ import annotations

import dataclasses

from megatron.planning.gpus import Gpu, detected_gpu, find_gpu
from megatron.planning.steptime import Links

GIB = 2**30
DEFAULT_GPUS_PER_NODE = 8


@dataclasses.dataclass(frozen=True)
class Machine:
    device: str
    """What the traces stand for: `cuda` or `cpu`."""
    name: str
    memory: int | None
    """Bytes one rank may hold (None: unknown)."""
    peak_tflops: float | None
    links: Links
    source: str
    """Where the figures come from, for the report."""


def _links(cfg, gpu: Gpu | None) -> Links:
    p, launcher = cfg.planning, cfg.launcher
    nvlink = p.plan_nvlink_gb_per_s or (gpu.link_gb_per_s if gpu else 25.0)
    per_node = p.plan_gpus_per_node or launcher.num_gpus or DEFAULT_GPUS_PER_NODE
    return Links(nvlink, p.plan_network_gb_per_s, per_node)


def cpu_machine(cfg) -> Machine:
    """This machine's CPU, whose memory the run's ranks on it share."""
    import psutil

    ranks_here = max(1, min(cfg.parallel.world_size or 1, cfg.launcher.num_gpus or 1))
    memory = psutil.virtual_memory().total // ranks_here
    name = f"this machine's CPU ({ranks_here} rank{'s' if ranks_here > 1 else ''} sharing it)"
    return Machine("cpu", name, memory, None, _links(cfg, None), "no GPU named or found")


def machine_of(cfg) -> Machine:
    """The machine of the module docstring for `cfg`."""
    p = cfg.planning
    dtype, override = cfg.precision.dtype, cfg.logging.peak_theoretical_tflops
    gpu, source = None, ""
    if p.plan_gpu:
        gpu, source = find_gpu(p.plan_gpu), "plan_gpu"
    elif p.gpu_memory_gib:
        gpu, source = Gpu("GPU of gpu_memory_gib", p.gpu_memory_gib, None), "gpu_memory_gib"
    else:
        gpu, source = detected_gpu(), "this machine's GPU"
    if gpu is None:
        return cpu_machine(cfg)
    memory_gib = p.gpu_memory_gib or gpu.memory_gib
    if p.gpu_memory_gib and p.plan_gpu:
        source += " and gpu_memory_gib"
    peak = float(override) if override else gpu.peak_tflops(dtype)
    return Machine("cuda", gpu.name, int(memory_gib * GIB), peak, _links(cfg, gpu), source)
