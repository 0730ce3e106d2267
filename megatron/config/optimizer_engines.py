"""Optimizers that need each parameter whole, and the engines that would hand them flat pieces.

We build every optimizer ourselves (`megatron/training/optimizers.py`); DeepSpeed 0.19 then
wraps it according to the ZeRO stage, the precision and the engine
(`DeepSpeedEngine._do_optimizer_sanity_check`), and the wrapper decides what the optimizer
steps over:

| ZeRO | precision | engine          | DeepSpeed wrapper              | the optimizer sees        |
| ---- | --------- | --------------- | ------------------------------ | ------------------------- |
| 0    | fp32      | plain, pipeline | none                           | the parameters            |
| 0    | fp16      | plain, pipeline | FP16_UnfusedOptimizer (1)      | fp32 copies, same shapes  |
| 0    | bf16      | plain           | FP16_UnfusedOptimizer          | fp32 copies, same shapes  |
| 0    | bf16      | pipeline        | BF16_Optimizer                 | flat 1-D partitions       |
| 1, 2 | any       | plain, pipeline | DeepSpeedZeroOptimizer (2)     | flat 1-D partitions       |
| 3    | any       | plain (3)       | DeepSpeedZeroOptimizer_Stage3  | flat 1-D partitions       |

(1) DeepSpeed uses its flattening FP16_Optimizer only for (apex/DeepSpeed) FusedAdam, which
we never build. (2) BF16_Optimizer for bf16 with fp32 gradient accumulation at stage 1, also
flat. (3) The pipeline engine takes ZeRO stages 0 and 1 only (`validate.validate_parallel`).

An optimizer in `PER_PARAMETER_OPTIMIZERS` silently becomes a different optimizer on flat
partitions, so a config combining it with a flattening wrapper is refused at resolution.
Element-wise optimizers (Adam, AdamW, Lion, SGD, MADGRAD) are the same either way.
"""

from __future__ import annotations

from megatron.config.config import Config
from megatron.config.derive import _src
from megatron.config.schema import ConfigError

PER_PARAMETER_OPTIMIZERS = {
    "SM3": "keeps one accumulator per dimension of each parameter (a row and a column vector "
    "for a matrix); on a flat partition it degenerates into element-wise Adagrad",
    "OneBitAdam": "compresses each parameter's momentum with one scale per tensor and averages "
    "it over data-parallel ranks that must hold the same tensors; a flat partition mixes "
    "parameters and differs from rank to rank",
}
"""Optimizer types whose update depends on each parameter's shape or on the tensor as a whole,
with the reason (part of the refusal message)."""


def flattening_wrapper(cfg: Config) -> str | None:
    """The combination of this config that hands the optimizer flat 1-D partitions, or None
    when it steps over tensors shaped like the parameters (see the module docstring)."""
    p = cfg.parallel
    if p.zero_stage >= 1:
        return f"ZeRO stage {p.zero_stage} (DeepSpeed's ZeRO optimizer flattens the parameters)"
    if cfg.precision.dtype == "bf16" and p.pipe_parallel_size >= 1:
        return (
            f"bf16 with the pipeline engine (pipe_parallel_size {p.pipe_parallel_size}), which "
            "DeepSpeed wraps in its BF16_Optimizer over flat partitions"
        )
    return None


def validate_optimizer_engine(cfg: Config, sources: dict[str, str]) -> None:
    """Refuse a per-parameter optimizer with a wrapper that flattens the parameters."""
    opt = cfg.optimizer.optimizer_type
    combination = flattening_wrapper(cfg)
    if opt not in PER_PARAMETER_OPTIMIZERS or combination is None:
        return
    where = _src(sources, "optimizer", "zero_optimization", "pipe_parallel_size", "precision")
    raise ConfigError(
        f"optimizer {opt} cannot run with {combination}{where}: {opt} "
        f"{PER_PARAMETER_OPTIMIZERS[opt]}. Use zero_optimization stage 0 (with bf16 also "
        "pipe_parallel_size: 0, the plain engine), or an element-wise optimizer such as "
        "Adam, Lion or SGD"
    )
