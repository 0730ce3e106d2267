"""DeepSpeed sections passed through to the engine config (`cfg.deepspeed`), and GPT-NeoX's
`curriculum_learning`, which the trainer runs itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Keys of this group are copied into the DeepSpeed config dict as they are when set.
PASSTHROUGH = (
    "amp",
    "flops_profiler",
    "comms_logger",
    "csv_monitor",
    "autotuning",
    "communication_data_type",
    "prescale_gradients",
    "gradient_predivide_factor",
    "sparse_gradients",
    "dump_state",
    "data_efficiency",
    "compression_training",
    "elasticity",
    "checkpoint",
    "data_types",
)


@dataclass(frozen=True)
class DeepSpeedConfig:
    deepspeed_extra_args: dict[str, Any] | None = None
    """Further DeepSpeed config sections, merged into the exported DeepSpeed config; a key that
    another setting already exports is an error."""

    amp: dict[str, Any] | None = None
    """DeepSpeed `amp` section."""

    flops_profiler: dict[str, Any] | None = None
    """DeepSpeed `flops_profiler` section."""

    comms_logger: dict[str, Any] | None = None
    """DeepSpeed `comms_logger` section."""

    csv_monitor: dict[str, Any] | None = None
    """DeepSpeed `csv_monitor` section."""

    autotuning: dict[str, Any] | None = None
    """DeepSpeed `autotuning` section."""

    communication_data_type: str | None = None
    """DeepSpeed `communication_data_type` (e.g. `fp32`)."""

    prescale_gradients: bool | None = None
    """DeepSpeed `prescale_gradients`."""

    gradient_predivide_factor: float | None = None
    """DeepSpeed `gradient_predivide_factor`."""

    sparse_gradients: bool | None = None
    """DeepSpeed `sparse_gradients`."""

    dump_state: bool | None = None
    """DeepSpeed `dump_state`."""

    curriculum_learning: dict[str, Any] | None = None
    """GPT-NeoX's sequence-length curriculum (DeepSpeed's legacy section, run by the trainer:
    DeepSpeed 0.19 no longer takes it): `enabled`, `curriculum_type: seqlen`, `min_difficulty`,
    `max_difficulty` (at most `seq_length`), `schedule_type` (`fixed_linear`, `fixed_root`,
    `fixed_discrete`) and its `schedule_config` (`total_curriculum_step`, `difficulty_step`,
    `root_degree`; or `difficulty`, `max_step`). Step i trains on the first
    `min(schedule(i + 1), seq_length)` tokens of each sample; evaluation on all of them."""

    data_efficiency: dict[str, Any] | None = None
    """DeepSpeed `data_efficiency` section."""

    compression_training: dict[str, Any] | None = None
    """DeepSpeed `compression_training` section."""

    elasticity: dict[str, Any] | None = None
    """DeepSpeed `elasticity` section."""

    checkpoint: dict[str, Any] | None = None
    """DeepSpeed `checkpoint` section."""

    data_types: dict[str, Any] | None = None
    """DeepSpeed `data_types` section (e.g. `grad_accum_dtype`)."""
