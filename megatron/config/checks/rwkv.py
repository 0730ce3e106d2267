"""What `rwkv` layers (`attention_config`) need, refused at resolution with the reason.

GPT-NeoX's own checks (its `arguments.py`): no tensor parallelism (the layers are not split over
ranks; pipeline parallelism works), no ZeRO stage 3, no dropout (the layers have none). Here
also: no sequence parallelism (it needs tensor parallelism), no experts (an RWKV layer has no
MLP to replace), and the widths (`megatron/model/rwkv.py::rwkv_widths`, which the model applies
too) must fit the heads.
"""

from __future__ import annotations

from megatron.config.config import Config
from megatron.config.groups.model import rwkv_ffn_dim
from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src


def validate_rwkv(cfg: Config, sources: dict[str, str]) -> None:
    m, p = cfg.model, cfg.parallel
    if "rwkv" not in m.layer_attention_types:
        return
    where = _src(sources, "attention_config")
    # key -> (refused, the value as said, why and what to do)
    refusals = {
        "model_parallel_size": (
            p.model_parallel_size > 1,
            p.model_parallel_size,
            "the layers are not split over tensor-parallel ranks (as in GPT-NeoX); set "
            "model_parallel_size: 1 (pipe_parallel_size works)",
        ),
        "sequence_parallel": (
            p.sequence_parallel,
            True,
            "the layers read the whole sequence; set sequence_parallel: false",
        ),
        "zero_optimization": (
            p.zero_stage == 3,
            "stage 3",
            "GPT-NeoX does not run rwkv layers under ZeRO stage 3; use stage 0, 1 or 2",
        ),
        "hidden_dropout": (m.hidden_dropout > 0, m.hidden_dropout, "the layers have no dropout"),
        "attention_dropout": (
            m.attention_dropout > 0,
            m.attention_dropout,
            "the layers have no dropout",
        ),
        "moe_num_experts": (
            cfg.moe.moe_num_experts > 1,
            cfg.moe.moe_num_experts,
            "the layers have no MLP to replace with experts",
        ),
    }
    for key, (refused, value, why) in refusals.items():
        if refused:
            raise ConfigError(
                f"{key} {value}{_src(sources, key)} cannot be used with rwkv layers in "
                f"attention_config{where}: {why}"
            )
    heads = m.num_attention_heads
    dim_att = m.dim_att or m.hidden_size
    if dim_att < 1 or dim_att % heads:
        raise ConfigError(
            f"dim_att {dim_att}{_src(sources, 'dim_att', 'hidden_size')} must be a positive "
            f"multiple of num_attention_heads {heads} (the rwkv heads split it)"
        )
    if m.head_size is not None and m.head_size != dim_att // heads:
        raise ConfigError(
            f"head_size {m.head_size}{_src(sources, 'head_size')} is not dim_att / "
            f"num_attention_heads = {dim_att // heads}; remove it (it is computed) or change "
            "dim_att"
        )
    ffn_dim = (
        m.ffn_dim
        if m.ffn_dim is not None
        else rwkv_ffn_dim(None, m.intermediate_size, m.hidden_size)
    )
    if ffn_dim < 1:
        raise ConfigError(
            f"ffn_dim{_src(sources, 'ffn_dim', 'intermediate_size', 'hidden_size')} must be "
            "positive or null (intermediate_size, else 3.5 × hidden_size, rounded down to a "
            f"multiple of 32), got {ffn_dim}"
        )
