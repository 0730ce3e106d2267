"""Optimizers that need each parameter whole, and the engines that would hand them flat pieces.

We build every optimizer ourselves (`megatron/training/optim/optimizers.py`); DeepSpeed 0.19 then
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

An optimizer whose update needs whole parameters (`OptimizerType.whole_parameter` in
`megatron/config/groups/optimizer.py::OPTIMIZER_TYPES`) silently becomes a different optimizer on
flat partitions, so a config combining it with a flattening wrapper is refused at resolution.
Element-wise optimizers (Adam, AdamW, Lion, SGD, MADGRAD) are the same either way.
"""

from __future__ import annotations

from megatron.config.config import Config
from megatron.config.groups.optimizer import OPTIMIZER_TYPES
from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src


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


DISTRO_PARAMS = (
    "compression_decay",
    "compression_chunk",
    "compression_topk",
    "quantize_1bit",
    "clip_grad_norm",
    "weight_decay",
)
"""Psyche's names accepted in `optimizer.params` of Distro (besides `lr`)."""


def validate_distro(cfg: Config, sources: dict[str, str]) -> None:
    """Distro's params, and the precision it needs.

    Psyche's `clip_grad_norm` and `weight_decay` are the same facts as our `gradient_clipping`
    (which, with Distro's un-reduced gradients, clips each rank's local gradient by its norm
    over tensor and pipeline stages, as Psyche does) and `weight_decay`: given in params, they
    must agree with those keys.
    """
    o = cfg.optimizer
    if o.optimizer_type != "Distro":
        return
    where = _src(sources, "optimizer")
    params = o.optimizer_params or {}
    unknown = sorted(set(params) - set(DISTRO_PARAMS))
    if unknown:
        raise ConfigError(
            f"optimizer.params{where}: {unknown} are not Distro parameters; expected lr and "
            f"any of {', '.join(DISTRO_PARAMS)}"
        )
    for key, top in (("clip_grad_norm", "gradient_clipping"), ("weight_decay", "weight_decay")):
        if key in params and float(params[key]) != float(getattr(o, top)):
            raise ConfigError(
                f"optimizer.params.{key}{where} is {params[key]} but {top} is "
                f"{getattr(o, top)}{_src(sources, top)}: they are one setting; give it once, "
                f"as {top}"
            )
    if cfg.moe.moe_num_experts > 1:
        raise ConfigError(
            f"optimizer Distro cannot run with moe_num_experts {cfg.moe.moe_num_experts}"
            f"{_src(sources, 'moe_num_experts')}: expert gradients have their own reduction "
            "over the ranks holding the same experts, and Distro's exchange over the whole "
            "data-parallel group would mix different experts' momenta. Use moe_num_experts: 1 "
            "or another optimizer"
        )
    if cfg.precision.dtype != "fp32":
        raise ConfigError(
            f"optimizer Distro cannot run with precision {cfg.precision.dtype}"
            f"{_src(sources, 'precision', 'fp16', 'bf16')}: DeepSpeed's mixed-precision "
            "wrapper decides overflow skips and clipping from a gradient norm it reduces over "
            "the model-parallel group only, which with Distro's un-reduced gradients differs "
            "between data-parallel ranks, so replicas could drift apart. Use precision: fp32"
        )


def validate_optimizer_engine(cfg: Config, sources: dict[str, str]) -> None:
    """Refuse a per-parameter optimizer with a wrapper that flattens the parameters."""
    validate_distro(cfg, sources)
    opt = cfg.optimizer.optimizer_type
    combination, why = flattening_wrapper(cfg), OPTIMIZER_TYPES[opt].whole_parameter
    if not why or combination is None:
        return
    where = _src(sources, "optimizer", "zero_optimization", "pipe_parallel_size", "precision")
    raise ConfigError(
        f"optimizer {opt} cannot run with {combination}{where}: {opt} {why}. Use "
        "zero_optimization stage 0 (with bf16 also pipe_parallel_size: 0, the plain engine), "
        "or an element-wise optimizer such as Adam, Lion or SGD"
    )
