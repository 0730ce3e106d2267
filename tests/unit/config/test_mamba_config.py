"""`mamba` layers in configs: GPT-NeoX's keys and defaults, and what is refused with why."""

import pytest
import torch

from megatron.config import ConfigError, load_config
from megatron.config.groups.model import ModelConfig
from megatron.model.args import ModelArgs
from megatron.model.gpt import build_gpt
from tests.unit.config.conftest import MINIMAL

# GPT-NeoX's megatron/neox_arguments/neox_args.py defaults of the Mamba keys, copied by hand.
NEOX_MAMBA_DEFAULTS = {
    "mamba_selective_scan_fusion": False,
    "mamba_causal_conv_fusion": False,
    "mamba_inner_func_fusion": False,
    "mamba_selective_fp32_params": True,
    "mamba_use_bias_in_conv": True,
    "mamba_use_bias_in_linears": False,
}


def _load(write, text, **kw):
    kw.setdefault("warn", [])
    return load_config([write("run.yml", MINIMAL + text)], **kw)


def test_mamba_keys_have_gpt_neox_defaults():
    defaults = ModelConfig()
    assert {k: getattr(defaults, k) for k in NEOX_MAMBA_DEFAULTS} == NEOX_MAMBA_DEFAULTS


def test_mamba_layers_mix_with_attention(write):
    warn: list[str] = []
    text = 'attention_config: [[["mamba", "global"], 1]]\nmamba_use_bias_in_conv: false\n'
    cfg = _load(write, text, warn=warn)
    assert cfg.model.layer_attention_types == ("mamba", "global")
    assert cfg.model.mamba_use_bias_in_conv is False and warn == []


@pytest.mark.parametrize(
    "text, match",
    [
        ("model_parallel_size: 2\n", "model_parallel_size 2.*x_proj.*model_parallel_size: 1"),
        ("zero_optimization: {stage: 3}\n", "ZeRO stage 3.*Mamba"),
        ("precision: bf16\n", "mamba_selective_fp32_params: true.*bf16.*false"),
        (
            "mamba_use_bias_in_linears: true\nmamba_inner_func_fusion: true\n",
            "mamba_use_bias_in_linears and mamba_inner_func_fusion.*run.yml",
        ),
        ("torch_compile: true\nmamba_selective_scan_fusion: true\n", "mamba_selective_scan"),
    ],
    ids=["tp", "zero3", "fp32-params", "bias-inner-fusion", "compile-kernels"],
)
def test_what_mamba_cannot_do_is_refused(write, text, match):
    with pytest.raises(ConfigError, match=match):
        _load(write, 'attention_config: [[["mamba"], 2]]\n' + text, world_size=2)


def test_heads_need_not_split_the_width_when_no_layer_attends(write):
    """GPT-NeoX's Mamba configs keep 12 heads at widths 12 does not divide (mamba-370M: 1024),
    which GPT-NeoX allows when the model has Mamba layers; with an attention layer beside them
    the heads split the width again."""
    heads = ["num_attention_heads=12"]  # MINIMAL's hidden_size is 64
    cfg = _load(write, 'attention_config: [[["mamba"], 2]]\n', overrides=heads, vocab_size=64)
    args = ModelArgs.from_config(cfg)
    tokens = torch.randint(0, 64, (2, 8))
    logits = build_gpt(args)(tokens, torch.arange(8).expand(2, -1))
    assert args.layer_attention_types == ("mamba", "mamba")
    assert logits.shape == (2, 8, args.vocab_size)
    with pytest.raises(ConfigError, match="hidden_size 64 is not divisible by num_attention_h"):
        _load(write, 'attention_config: [[["mamba", "global"], 1]]\n', overrides=heads)


def test_half_precision_trains_with_fp32_params_off(write):
    text = 'attention_config: [[["mamba"], 2]]\nprecision: bf16\n'
    cfg = _load(write, text + "mamba_selective_fp32_params: false\n")
    assert cfg.precision.dtype == "bf16"
