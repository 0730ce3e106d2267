"""Checks of configs with `mamba` layers: what GPT-NeoX's Mamba block cannot do here, and why.

- Tensor parallelism: GPT-NeoX splits `d_inner` over the ranks but leaves `x_proj`'s output
  un-reduced (`parallel_output=True`), so each rank computes its step sizes and `B`, `C` from
  its slice only and a tp > 1 model is a different function from the same weights at tp = 1;
  it is refused rather than reproduced.
- ZeRO stage 3: refused, as GPT-NeoX refuses it.
- `mamba_selective_fp32_params: true` under fp16/bf16: keeping `A_log` and `D` in fp32 inside
  a half-precision module needs DeeperSpeed's uncast parameters, which DeepSpeed lacks.
- `mamba_use_bias_in_linears` with `mamba_inner_func_fusion`: the fused kernel has no
  `x_proj` bias (GPT-NeoX refuses the pair too).
"""

from __future__ import annotations

from megatron.config.config import Config
from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src

MAMBA = "mamba"
"""The `attention_config` type of a Mamba layer."""


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
    dtype = cfg.precision.dtype
    if m.mamba_selective_fp32_params and dtype != "fp32":
        raise ConfigError(
            f"mamba_selective_fp32_params: true{_src(sources, 'mamba_selective_fp32_params')} "
            f"cannot be honoured in {dtype} training {where}: keeping A_log and D in fp32 "
            "inside a half-precision model needs DeeperSpeed's uncast parameters, and "
            f"DeepSpeed stores every module parameter in {dtype} (the fp32 master copies live "
            "in the optimizer). Set mamba_selective_fp32_params: false (the scan still reads "
            "them in fp32) or train in fp32"
        )
    if m.mamba_use_bias_in_linears and m.mamba_inner_func_fusion:
        raise ConfigError(
            "mamba_use_bias_in_linears and mamba_inner_func_fusion"
            f"{_src(sources, 'mamba_use_bias_in_linears', 'mamba_inner_func_fusion')} cannot "
            "be combined: mamba-ssm's fused mixer has no x_proj bias; turn one of them off"
        )
