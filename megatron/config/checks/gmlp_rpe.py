"""Checks of the gMLP/aMLP layer types and of T5's relative position bias (`pos_emb: rpe`)."""

from __future__ import annotations

from megatron.config.config import Config
from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src

GMLP_TYPES = ("gmlp", "amlp")
"""`attention_config` types built as gMLP blocks (`megatron/model/gmlp.py`)."""


def validate_gmlp(cfg: Config, sources: dict[str, str]) -> None:
    m, tp = cfg.model, cfg.parallel.model_parallel_size
    used = sorted(set(m.layer_attention_types) & set(GMLP_TYPES))
    if not used:
        return
    where = _src(sources, "attention_config")
    if tp > 1:
        raise ConfigError(
            f"attention_config{where} uses {used} with model_parallel_size {tp}"
            f"{_src(sources, 'model_parallel_size')}: GPT-NeoX normalises and gates each "
            "tensor-parallel rank's own slice of a gMLP block's channels, so the block would "
            "compute a different function at every model_parallel_size; use "
            "model_parallel_size: 1 (pipeline and data parallelism work)"
        )
    if cfg.moe.moe_num_experts > 1:
        raise ConfigError(
            f"attention_config{where} uses {used} with moe_num_experts "
            f"{cfg.moe.moe_num_experts}{_src(sources, 'moe_num_experts')}: a gMLP block has "
            "no MLP for experts to replace; use moe_num_experts: 1 or attention layers"
        )
    if m.activation.endswith("glu"):  # the gated activations (model/activations.py)
        raise ConfigError(
            f"activation {m.activation}{_src(sources, 'activation')} is gated (two inputs); "
            f"gMLP layers {used} apply a one-input activation before their spatial gating "
            "unit: use gelu, gelu_tanh, silu, relu or relu_squared"
        )
    if "amlp" in used and m.gmlp_attn_dim < 1:
        raise ConfigError(
            f"gmlp_attn_dim{_src(sources, 'gmlp_attn_dim')} must be a positive integer (the "
            f"width of amlp's tiny attention), got {m.gmlp_attn_dim}"
        )


def validate_rpe(cfg: Config, sources: dict[str, str]) -> None:
    m = cfg.model
    if m.pos_emb != "rpe":
        return
    buckets, distance = m.rpe_num_buckets, m.rpe_max_distance
    if buckets < 2:
        raise ConfigError(
            f"rpe_num_buckets{_src(sources, 'rpe_num_buckets')} must be >= 2 (half exact "
            f"distances, half logarithmic), got {buckets}"
        )
    if distance <= buckets // 2:
        raise ConfigError(
            f"rpe_max_distance {distance} must exceed rpe_num_buckets // 2 = {buckets // 2}"
            f"{_src(sources, 'rpe_max_distance', 'rpe_num_buckets')}: distances below "
            "rpe_num_buckets // 2 have exact buckets and the rest are spread logarithmically "
            "up to rpe_max_distance"
        )
