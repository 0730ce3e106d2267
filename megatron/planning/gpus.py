"""The GPUs a plan can be for: memory and NVLink bandwidth by name (peaks: `flops.py`).

Memory is what `torch.cuda.get_device_properties(i).total_memory` reports for the card (a
little less than the marketing figure: an 80 GB H100 reports 79.1 GiB). NVLink is one
direction per GPU, the figure a ring collective's bus bandwidth approaches within a node;
`None` where the card has none (PCIe cards: the plan then takes PCIe 4's 25 GB/s). Dense peak
TFLOP/s come from `megatron/training/metrics/flops.py::PEAK_TFLOPS` by the same name, the
table MFU is computed against, so a plan and a run use one figure.
"""

from __future__ import annotations

import dataclasses
import difflib

from megatron.config import ConfigError
from megatron.training.metrics.flops import peak_tflops

PCIE_GB_PER_S = 25.0


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    nvlink_gb_per_s: float | None

    def peak_tflops(self, dtype: str) -> float | None:
        return peak_tflops(dtype, device_name=self.name)

    @property
    def link_gb_per_s(self) -> float:
        return self.nvlink_gb_per_s or PCIE_GB_PER_S


GPUS: list[Gpu] = [
    Gpu("H200", 139.8, 450.0),
    Gpu("H100 PCIe", 79.1, None),  # before H100: a detected name is matched in this order
    Gpu("H100", 79.1, 450.0),
    Gpu("GH200", 94.5, 450.0),
    Gpu("B200", 178.4, 900.0),
    Gpu("A100-80GB", 79.2, 300.0),
    Gpu("A100-40GB", 39.4, 300.0),
    Gpu("A800", 79.2, 200.0),
    Gpu("A10G", 22.0, None),
    Gpu("L40S", 44.4, None),
    Gpu("L4", 22.0, None),
    Gpu("A6000", 47.5, None),
    Gpu("V100-32GB", 31.7, 150.0),
    Gpu("V100-16GB", 15.8, 150.0),
    Gpu("MI300X", 192.0, 448.0),
    Gpu("MI250X", 64.0, 200.0),
]


def find_gpu(name: str) -> Gpu:
    """The table's GPU of `name` (case and spacing ignored), or a `ConfigError` listing them."""
    key = name.replace(" ", "").replace("_", "-").lower()
    for gpu in GPUS:
        if gpu.name.replace(" ", "").lower() == key:
            return gpu
    names = [g.name for g in GPUS]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ConfigError(
        f"plan_gpu '{name}' is not in the plan's GPU table ({', '.join(names)}){hint}; or set "
        "gpu_memory_gib (and peak_theoretical_tflops) for another GPU"
    )


def detected_gpu() -> Gpu | None:
    """The GPU of this machine, matched to the table by its name (memory as reported)."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    memory = props.total_memory / 2**30
    for gpu in GPUS:
        if gpu.name.split("-")[0] in props.name:
            return dataclasses.replace(gpu, name=props.name, memory_gib=memory)
    return Gpu(props.name, memory, None)
