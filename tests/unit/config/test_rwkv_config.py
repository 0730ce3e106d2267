"""`rwkv` layers in configs: GPT-NeoX's shipped RWKV config resolves unchanged, and what the
layers cannot run with is refused naming the key and the file (GPT-NeoX's own refusals)."""

from pathlib import Path

import pytest

from megatron.config import ConfigError, load_config
from megatron.model import ModelArgs
from megatron.model.rwkv import rwkv_widths

from .conftest import MINIMAL

NEOX_RWKV = Path(__file__).resolve().parents[2] / "data" / "configs" / "rwkv-170m-neox.yml"
RWKV = "attention_config: [[[rwkv], 2]]\n"


def _load(write, text, **kwargs):
    return load_config([write("run.yml", MINIMAL + text)], warn=[], **kwargs)


def test_gpt_neox_rwkv_170m_config_resolves():
    warn: list[str] = []
    cfg = load_config([NEOX_RWKV], world_size=1, vocab_size=50277, warn=warn)
    assert len(warn) == 1 and "'synchronize_each_layer'" in warn[0]  # its cost, warned
    m = cfg.model
    assert m.layer_attention_types == ("rwkv",) * 12
    assert (m.hidden_size, m.num_attention_heads, m.norm, m.pos_emb) == (
        768,
        12,
        "rmsnorm",
        "learned",
    )
    # GPT-NeoX: dim_att = hidden_size, head_size = dim_att / heads = 64, ffn = 3.5 h floored to 32
    assert rwkv_widths(ModelArgs.from_config(cfg)) == (768, 64, 2688)
    assert cfg.precision.dtype == "bf16" and cfg.parallel.zero_stage == 1


@pytest.mark.parametrize(
    "text, world_size, key",
    [
        ("model_parallel_size: 2\n", 2, "model_parallel_size"),
        ("zero_optimization: {stage: 3}\npipe_parallel_size: 0\n", 1, "zero_optimization"),
        ("hidden_dropout: 0.1\n", 1, "hidden_dropout"),
        ("attention_dropout: 0.1\n", 1, "attention_dropout"),
        ("moe_num_experts: 2\n", 1, "moe_num_experts"),
    ],
)
def test_what_rwkv_layers_cannot_run_with_is_refused(write, text, world_size, key):
    message = (
        rf"^{key} .*run.yml\) cannot be used with rwkv layers in attention_config \(.*run.yml\): "
    )
    with pytest.raises(ConfigError, match=message):
        _load(write, RWKV + text, world_size=world_size)


@pytest.mark.parametrize(
    "text, message",
    [
        ("dim_att: 66\n", "dim_att 66 .*must be a positive multiple of num_attention_heads 4"),
        ("head_size: 8\n", "head_size 8 .*is not dim_att / num_attention_heads = 16"),
        ("ffn_dim: 0\n", "ffn_dim .*must be positive or null"),
        ("intermediate_size: 16\n", "ffn_dim .*must be positive or null.*got 0"),
    ],
)
def test_rwkv_widths_are_checked(write, text, message):
    with pytest.raises(ConfigError, match=message):
        _load(write, RWKV + text)


def test_widths_mean_nothing_without_rwkv_layers(write):
    assert _load(write, "head_size: 8\n").model.head_size == 8
    assert _load(write, RWKV + "head_size: 16\ndim_att: 64\n").model.layer_attention_types == (
        "rwkv",
        "rwkv",
    )
