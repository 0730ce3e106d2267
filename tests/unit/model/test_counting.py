"""Parameter counts: the analytic count from the config equals the parameters really built."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron.config import config_from_dict
from megatron.model import (
    ModelArgs,
    build_gpt,
    build_model,
    count_model_parameters,
    count_parameters,
    parameter_breakdown,
)
from tests.unit.model.tiny import llama_args, neox_args

PYTHIA_160M = {
    "num_layers": 12,
    "hidden_size": 768,
    "num_attention_heads": 12,
    "seq_length": 2048,
    "max_position_embeddings": 2048,
    "norm": "layernorm",
    "pos_emb": "rotary",
    "rotary_pct": 0.25,
    "no_weight_tying": True,
    "gpt_j_residual": True,
    "activation": "gelu",
    "train_micro_batch_size_per_gpu": 1,
    "optimizer": {"type": "Adam", "params": {"lr": 6e-4}},
}


def test_pythia_160m_count_matches_published_and_built_model():
    # GPT-2 tokenizer (50277 tokens) padded to a multiple of 128 -> 50304 rows.
    cfg = config_from_dict(PYTHIA_160M, world_size=1, vocab_size=50277)
    assert cfg.model.padded_vocab_size == 50304
    assert count_parameters(cfg) == 162_322_944
    with torch.device("meta"):  # shapes only: no 650 MB of weights
        model = build_model(cfg)
    assert count_model_parameters(model) == 162_322_944
    breakdown = parameter_breakdown(ModelArgs.from_config(cfg))
    assert breakdown["embedding"] == breakdown["head"] == 50304 * 768


VARIANTS = {
    "neox": neox_args(),
    "neox_tied_sequential": neox_args(gpt_j_residual=False, no_weight_tying=False),
    "gpt_j_tied_norm": neox_args(gpt_j_tied=True),
    "learned_rmsnorm_bias": neox_args(pos_emb="learned", norm="rmsnorm"),
    "scalenorm_geglu": neox_args(norm="scalenorm", activation="geglu", mlp_multiple_of=16),
    "nonparam_relu_alibi": neox_args(norm="non_parametric_layernorm", pos_emb="alibi"),
    "gmlp_amlp_rpe": neox_args(
        layer_attention_types=("gmlp", "amlp", "global", "amlp"), gmlp_attn_dim=8, pos_emb="rpe"
    ),
    "llama": llama_args(),
    "mamba_and_attention": llama_args(layer_attention_types=("mamba", "global") * 2),
    "llama_qk_norm_biases": llama_args(
        use_qk_layernorm=True, use_bias_in_attn_linear=True, use_bias_in_mlp=True
    ),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_count_from_config_equals_real_count(name):
    args = VARIANTS[name]
    model = build_gpt(args)
    assert count_model_parameters(model) == count_parameters(args)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(args)


def test_learned_positions_are_counted_once():
    args = neox_args(pos_emb="learned", max_position_embeddings=32)
    assert parameter_breakdown(args)["position"] == 32 * args.hidden_size
    plain = dataclasses.replace(args, pos_emb="rotary")
    assert count_parameters(args) - count_parameters(plain) == 32 * args.hidden_size
