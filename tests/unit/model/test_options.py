"""Every architecture option builds, runs forward and backward, and reaches every parameter;
unknown option values are refused with the valid ones named."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron.model import ModelArgs, build_gpt
from megatron.model.activations import ACTIVATIONS
from megatron.model.init_methods import INIT_METHODS
from megatron.model.norms import NORMS
from megatron.model.positional import POSITIONAL_ENCODINGS
from tests.unit.model.tiny import llama_args, micro_batches, neox_args

OPTIONS = (
    [{"norm": n} for n in NORMS]
    + [{"activation": a} for a in ACTIVATIONS]
    + [{"pos_emb": p} for p in POSITIONAL_ENCODINGS]
    + [{"init_method": i, "output_layer_init_method": i} for i in INIT_METHODS]
    + [
        {"gpt_j_residual": False},
        {"gpt_j_tied": True},
        {"no_weight_tying": False},
        {"num_kv_heads": 1},
        {"use_qk_layernorm": True},
        {"use_bias_in_norms": False, "use_bias_in_attn_linear": False, "use_bias_in_mlp": False},
        {"apply_query_key_layer_scaling": True, "attention_softmax_in_fp32": True},
        {"layer_attention_types": ("sdpa", "flash"), "softmax_fusion": True},
        {"layer_attention_types": ("global", "sdpa"), "softmax_fusion": True, "pos_emb": "alibi"},
        {"layer_attention_types": ("gmlp", "amlp"), "gmlp_attn_dim": 8},
        {"layer_attention_types": ("amlp", "sdpa"), "pos_emb": "rpe", "rpe_num_buckets": 6},
        {"layer_attention_types": ("global", "flash"), "softmax_fusion": True, "pos_emb": "rpe"},
        {"intermediate_size": 40},
        {"layer_attention_types": ("rwkv", "global"), "dim_att": 48, "ffn_dim": 40},
        {"sliding_window_width": 2},
        {"head_dim": 12, "use_bias_in_attn_linear": False, "use_bias_in_qkv": True},
        {"z_loss": 1.0e-2},
        {"rope_scaling": {"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 8}},
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 8},
        {"layer_attention_types": ("mamba", "global")},
        {
            "layer_attention_types": ("mamba", "mamba"),
            "mamba_use_bias_in_conv": False,
            "mamba_use_bias_in_linears": True,
        },
    ]
)


@pytest.mark.parametrize(
    "overrides", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items())
)
def test_option_trains(overrides):
    args = neox_args(num_layers=2, **overrides)
    model = build_gpt(args).train()
    for name, p in model.named_parameters():
        if name.endswith("sgu.spatial_weight"):  # zero at init (the paper's): a constant gate
            p.data.normal_(0.0, 0.1)  # would leave the gate's norm without gradient
    ((inputs, labels),) = micro_batches(args, 1)
    logits = model(*inputs)
    assert logits.shape == (*inputs[0].shape, args.vocab_size)
    loss = model.loss_fn(logits, labels)
    assert torch.isfinite(loss)
    loss.backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert not no_grad, f"parameters without gradient: {no_grad}"


def test_options_change_the_function():
    # Guards against an option silently ignored: each changes the logits of the same weights.
    base = neox_args()
    ((inputs, _),) = micro_batches(base, 1)
    reference = build_gpt(base)(*inputs)
    for change in (
        {"rotary_pct": 1.0},
        {"rotary_emb_base": 100},
        {"layernorm_epsilon": 0.5},
        {"sliding_window_width": 1},
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    ):
        changed = build_gpt(dataclasses.replace(base, **change))(*inputs)
        assert not torch.allclose(changed, reference), f"{change} had no effect"


def test_llama_shape_trains():
    args = llama_args()
    model = build_gpt(args)
    ((inputs, labels),) = micro_batches(args, 1)
    model.loss_fn(model(*inputs), labels).backward()
    qkv = model.get_submodule("2.attention.query_key_value").weight
    assert qkv.shape == ((4 + 2 * 2) * 8, 32)  # (nq + 2 nkv) * head_dim rows


@pytest.mark.parametrize(
    "key, value, hint",
    [
        ("norm", "layer_norm", "did you mean 'layernorm'"),
        ("activation", "swiglu2", "swiglu"),
        ("pos_emb", "rope", "rotary"),
        ("init_method", "kaiming", "small_init"),
        ("layer_attention_types", ("ring",) * 4, "flash"),
        ("pipe_partition_method", "by_size", "type:transformer"),
    ],
)
def test_unknown_values_are_refused_with_valid_ones(key, value, hint):
    with pytest.raises(ValueError, match=hint):
        build_gpt(neox_args(**{key: value}))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hidden_size": 30}, "not divisible by num_attention_heads"),
        ({"num_kv_heads": 3}, "num_kv_heads 3"),
        ({"rotary_pct": 0.1}, "rotary dims"),
        ({"checkpoint_num_layers": 0}, "checkpoint_num_layers"),
        ({"pipe_parallel_size": 2}, "ParallelTopology"),
    ],
)
def test_bad_settings_raise_errors_naming_them(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_gpt(neox_args(**overrides))


def test_model_args_require_positive_sizes():
    with pytest.raises(ValueError, match="vocab_size"):
        ModelArgs(num_layers=1, hidden_size=8, num_attention_heads=2, vocab_size=0, seq_length=4)
