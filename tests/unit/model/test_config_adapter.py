"""`build_model(cfg)` reads the resolved config: the keys reach the model, defined once."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from megatron.config import GROUPS, KEY_TO_GROUP, config_from_dict
from megatron.config.groups.model import ModelConfig
from megatron.config.schema import field_types
from megatron.model import ModelArgs, build_model
from megatron.model.args import CONFIG_ONLY, REQUIRED
from megatron.model.attention_backends import FusedSoftmaxAttention, SDPAAttention
from megatron.model.transformer import TransformerLayer

BASE = {
    "num_layers": 2,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "seq_length": 16,
    "train_micro_batch_size_per_gpu": 1,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
}


def test_llama_style_config_builds_the_llama_architecture():
    cfg = config_from_dict(
        {
            **BASE,
            "pipe_parallel_size": 0,
            "norm": "rmsnorm",
            "activation": "swiglu",
            "num_kv_heads": 2,
            "pos_emb": "rotary",
            "no_weight_tying": True,
            "use_bias_in_norms": False,
            "use_bias_in_attn_linear": False,
            "use_bias_in_mlp": False,
            "attention_config": [[["global", "flash"], 1]],
            "scaled_upper_triang_masked_softmax_fusion": True,
            "seed": 99,
            "loss_chunk_tokens": 0,  # the logits, read below
        },
        world_size=1,
        vocab_size=100,
    )
    args = ModelArgs.from_config(cfg)
    assert args.vocab_size == cfg.model.padded_vocab_size == 128
    assert args.seed == 99 and args.kv_heads == 2 and args.softmax_fusion
    model = build_model(cfg)
    layer = model.get_submodule("2")
    assert type(layer) is TransformerLayer
    assert type(layer.attention.core) is FusedSoftmaxAttention
    assert type(model.get_submodule("3").attention.core) is SDPAAttention
    assert model.get_submodule("6").final_linear.weight.shape == (128, 32)  # L + 4
    logits = model(torch.zeros(1, 16, dtype=torch.long), torch.arange(16)[None])
    assert logits.shape == (1, 16, 128)


def test_same_seed_same_model_and_duck_typed_config():
    ns = types.SimpleNamespace
    cfg = ns(
        model=ns(
            **{
                k: v
                for k, v in BASE.items()
                if k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
            },
            padded_vocab_size=64,
        ),
        parallel=ns(pipe_parallel_size=0),
        training=ns(seed=5),
    )
    a, b = build_model(cfg), build_model(cfg)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


def test_unresolved_vocabulary_is_reported():
    ns = types.SimpleNamespace
    cfg = ns(model=ns(num_layers=1, padded_vocab_size=None), parallel=ns(pipe_parallel_size=0))
    with pytest.raises(ValueError, match="padded_vocab_size"):
        build_model(cfg)


def test_every_model_key_is_defined_once_and_reaches_the_model():
    # ModelArgs takes its fields from the config groups: same type and default, and every
    # ModelConfig key is either a ModelArgs field or read into one in another form.
    own = {"vocab_size", "softmax_fusion", "value_head"}
    args_fields = {f.name: f for f in dataclasses.fields(ModelArgs)}
    for name in set(args_fields) - own:
        group = GROUPS[KEY_TO_GROUP[name]]
        config_field = {f.name: f for f in dataclasses.fields(group)}[name]
        assert args_fields[name].type == field_types(group)[name], name
        if name in REQUIRED:
            assert args_fields[name].default is dataclasses.MISSING
        else:
            assert args_fields[name].default == config_field.default, name
    for f in dataclasses.fields(ModelConfig):
        assert f.name in args_fields or CONFIG_ONLY[f.name] in args_fields, f.name


def test_config_values_reach_the_model_args():
    cfg = config_from_dict(
        {
            **BASE,
            "pipe_parallel_size": 2,
            "pipe_partition_method": "uniform",
            "norm": "rmsnorm",
            "rotary_pct": 0.25,
            "pos_emb": "rotary",
            "intermediate_size": 96,
            "checkpoint_activations": True,
            "seed": 7,
        },
        world_size=2,
        vocab_size=100,
    )
    args = ModelArgs.from_config(cfg)
    for f in dataclasses.fields(ModelArgs):
        if f.name not in ("vocab_size", "softmax_fusion", "value_head", "head_dim"):
            assert getattr(args, f.name) == cfg.get(f.name), f.name
    # A null head_dim is resolved to hidden_size / num_attention_heads.
    assert cfg.get("head_dim") is None and args.head_dim == args.hidden_size // 4
    assert (args.pipe_parallel_size, args.pipe_partition_method, args.seed) == (2, "uniform", 7)
