"""Checks of configs with `mamba` layers: what GPT-NeoX's Mamba block cannot do here, and why.

- Tensor parallelism: GPT-NeoX splits `d_inner` over the ranks but leaves `x_proj`'s output
  un-reduced (`parallel_output=True`), so each rank computes its step sizes and `B`, `C` from
  its slice only and a tp > 1 model is a different function from the same weights at tp = 1;
  it is refused rather than reproduced.
- ZeRO stage 3: refused, as GPT-NeoX refuses it.
- `mamba_selective_fp32_params: true` (GPT-NeoX's default) under fp16/bf16 keeps `A_log` and
  `D`, their gradients and optimizer state in fp32 groups of their own
  (`megatron/training/step/fp32_params.py`; dt_proj's bias is cast, as in GPT-NeoX), on both
  engines at ZeRO 0, 1 and 2. Refused with it: ZeRO offload (`offload_optimizer`, or the old
  `cpu_offload`), whose CPU buffers hold every gradient in the model's dtype, and a
  `data_types.grad_accum_dtype` other than the model's dtype (or fp32 where the trainer itself
  exports it, bf16 at ZeRO 1), which routes the gradients through DeepSpeed paths of that dtype.
- `mamba_use_bias_in_linears` with `mamba_inner_func_fusion`: the fused kernel has no
  `x_proj` bias (GPT-NeoX refuses the pair too).
"""

from __future__ import annotations

from megatron.config.config import Config
from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src

MAMBA = "mamba"
"""The `attention_config` type of a Mamba layer."""


def keeps_fp32_groups(cfg: Config) -> bool:
    """Whether `cfg`'s optimizer has fp32 groups (`megatron/model/param_groups.py`): Mamba
    layers with `mamba_selective_fp32_params` in an fp16/bf16 run."""
    m = cfg.model
    half = cfg.precision.dtype != "fp32"
    return half and MAMBA in m.layer_attention_types and m.mamba_selective_fp32_params


def validate_mamba(cfg: Config, sources: dict[str, str]) -> None:
    m, p = cfg.model, cfg.parallel
    if MAMBA not in m.layer_attention_types:
        return
    where = f"(mamba layers in attention_config{_src(sources, 'attention_config')})"
    tp = p.model_parallel_size
    if tp > 1:
        raise ConfigError(
            f"model_parallel_size {tp}{_src(sources, 'model_parallel_size')} is not supported "
            f"with Mamba layers {where}: GPT-NeoX's tensor-parallel Mamba leaves x_proj's "
            "output unreduced, so each rank derives the step sizes and B, C from its own slice "
            "and the model is not the one its weights compute at model_parallel_size 1; use "
            "model_parallel_size: 1 (pipeline and data parallelism work)"
        )
    if p.zero_stage == 3:
        raise ConfigError(
            f"ZeRO stage 3{_src(sources, 'zero_optimization')} is not supported with Mamba "
            f"layers {where} (GPT-NeoX refuses it too); use zero_optimization stage 0, 1 or 2"
        )
    if m.mamba_selective_fp32_params and cfg.precision.dtype != "fp32":
        _check_fp32_params(cfg, sources, where)
    if m.mamba_use_bias_in_linears and m.mamba_inner_func_fusion:
        raise ConfigError(
            "mamba_use_bias_in_linears and mamba_inner_func_fusion"
            f"{_src(sources, 'mamba_use_bias_in_linears', 'mamba_inner_func_fusion')} cannot "
            "be combined: mamba-ssm's fused mixer has no x_proj bias; turn one of them off"
        )


def _check_fp32_params(cfg: Config, sources: dict[str, str], where: str) -> None:
    """What cannot keep `A_log` and `D` fp32 in an fp16/bf16 run (module docstring)."""
    p, dtype = cfg.parallel, cfg.precision.dtype
    key = f"mamba_selective_fp32_params: true{_src(sources, 'mamba_selective_fp32_params')}"
    zero = p.zero_optimization or {}
    offload = (zero.get("offload_optimizer") or {}).get("device", "none")
    if offload not in (None, "none") or zero.get("cpu_offload"):
        section = "offload_optimizer" if offload not in (None, "none") else "cpu_offload"
        raise ConfigError(
            f"{key} cannot be combined with ZeRO offload (zero_optimization.{section}"
            f"{_src(sources, 'zero_optimization')}) in {dtype} training {where}: DeepSpeed's "
            f"offload buffers hold every gradient in {dtype}, so A_log and D would not stay "
            "fp32. Turn the offload off, or set mamba_selective_fp32_params: false"
        )
    accum = (cfg.deepspeed.data_types or {}).get("grad_accum_dtype")
    valid = {None, dtype} | ({"fp32"} if dtype == "bf16" and p.zero_stage == 1 else set())
    if accum not in valid:
        shown = ", ".join(sorted(v for v in valid if v))
        raise ConfigError(
            f"{key} cannot be combined with data_types.grad_accum_dtype {accum!r}"
            f"{_src(sources, 'data_types')} in {dtype} training at ZeRO stage {p.zero_stage} "
            f"{where}: that accumulation sends every gradient through DeepSpeed buffers of one "
            f"dtype, so A_log and D would not keep fp32 gradients. Leave grad_accum_dtype unset "
            f"(or set it to {shown}), or set mamba_selective_fp32_params: false"
        )
