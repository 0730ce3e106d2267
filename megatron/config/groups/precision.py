"""Numeric precision settings (`cfg.precision`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from megatron.config.schema import derived

# DeepSpeed's fp16 loss-scaling keys. GPT-NeoX's rwkv/170M.yml repeats them (and `"bf16": true`)
# in its bf16 section, where GPT-NeoX's DeepSpeed ignored them; DeepSpeed 0.19's bf16
# section refuses any key it does not know, so they are left out of it (bf16 trains without
# loss scaling anyway).
LOSS_SCALING_KEYS = (
    "loss_scale",
    "initial_scale_power",
    "loss_scale_window",
    "hysteresis",
    "consecutive_hysteresis",
    "min_loss_scale",
)


@dataclass(frozen=True)
class PrecisionConfig:
    precision: Literal["fp16", "bfloat16", "bf16", "fp32"] | None = None
    """Training precision. Inferred from `fp16`/`bf16` when those are enabled; `fp16` here
    without an `fp16` section uses DeepSpeed's default dynamic loss scaling."""

    fp16: dict[str, Any] | None = None
    """DeepSpeed fp16 section: `enabled`, `loss_scale` (0 = dynamic), `initial_scale_power`,
    `loss_scale_window`, `hysteresis`, `min_loss_scale`."""

    bf16: dict[str, Any] | None = None
    """DeepSpeed bf16 section: `enabled`, .... fp16's loss-scaling keys in it are ignored, as
    GPT-NeoX's DeepSpeed ignored them (bf16 trains without loss scaling)."""

    fp32_allreduce: bool = False
    """All-reduce gradients in fp32."""

    max_consecutive_skipped_steps: int = 50
    """Stop the run with an explanation (non-zero exit, naming the iteration) after this many
    consecutive skipped optimizer steps, in any precision. A step is skipped, leaving weights
    and optimizer state untouched, when fp16 overflows or the loss or gradient norm is inf/NaN."""

    dtype: Literal["fp16", "bf16", "fp32"] = derived("fp32")
    """Resolved parameter dtype (derived)."""
