"""Hugging Face configs to our keys and back, and what each direction refuses; plus the
refusals of resharding and evaluation set-up that need no model run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron.checkpoint_tools import export_hf
from megatron.checkpoint_tools.hf_import import _check_all_used, model_keys_from_hf
from megatron.checkpoint_tools.optimizer_read import read_optimizer_state
from megatron.evaluation import results_path, split_tasks
from megatron.model import ModelArgs, hf_config

transformers = pytest.importorskip("transformers")

LLAMA = transformers.LlamaConfig(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    max_position_embeddings=128,
    rope_theta=500000.0,
).to_dict()
NEOX = transformers.GPTNeoXConfig(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=256,
    max_position_embeddings=128,
    rotary_pct=0.25,
).to_dict()


def args_from(keys: dict) -> ModelArgs:
    fields = set(ModelArgs.__dataclass_fields__)
    return ModelArgs(vocab_size=256, **{k: v for k, v in keys.items() if k in fields})


@pytest.mark.parametrize("hf, arch", [(LLAMA, "llama"), (NEOX, "gpt_neox")])
def test_keys_from_hf_survive_the_way_back(hf, arch):
    found, keys = model_keys_from_hf(hf)
    assert found == arch
    back = hf_config(args_from(keys), arch, hf["vocab_size"])
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "tie_word_embeddings"):
        assert back[key] == hf[key], key
    rope = back["rope_parameters"]
    assert rope["rope_theta"] == hf["rope_parameters"]["rope_theta"]
    assert rope["partial_rotary_factor"] == hf["rope_parameters"].get("partial_rotary_factor", 1.0)
    if arch == "llama":
        assert keys["num_kv_heads"] == 2 and back["num_key_value_heads"] == 2


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(model_type="gpt2"), "model_type 'gpt2'"),
        (dict(hidden_act="gelu_new"), "hidden_act 'gelu_new'"),
        (
            dict(rope_parameters={"rope_type": "longrope", "rope_theta": 5e5, "factor": 8.0}),
            "rope_type 'longrope' is not supported",
        ),
        (
            dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}),
            r"llama3\) is missing \['low_freq_factor', 'high_freq_factor'\]",
        ),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4 + 0.5}), "rope_theta"),
    ],
)
def test_import_refuses_what_our_model_cannot_express(change, message):
    with pytest.raises(ValueError, match=message):
        model_keys_from_hf({**NEOX, **change})


def test_import_refuses_weights_it_would_drop():
    _, keys = model_keys_from_hf(LLAMA)
    state = {"model.layers.0.self_attn.q_norm.weight": torch.ones(16)}
    with pytest.raises(ValueError, match="q_norm"):
        _check_all_used(state, args_from(keys), "llama")


def test_export_refuses_a_model_the_architecture_cannot_express(tmp_path):
    alibi = ModelArgs(
        num_layers=1, hidden_size=32, num_attention_heads=4, vocab_size=64, seq_length=8,
        pos_emb="alibi",
    )  # fmt: skip
    with pytest.raises(ValueError, match="pos_emb"):
        export_hf({}, alibi, tmp_path / "out", architecture="gpt_neox")
    with pytest.raises(ValueError, match="architecture 'gpt2'"):
        export_hf({}, alibi, tmp_path / "out", architecture="gpt2")


def test_optimizer_state_that_cannot_move_is_dropped_naming_the_optimizer():
    def reader(optimizer, dtype):
        cfg = SimpleNamespace(
            parallel=SimpleNamespace(zero_stage=2),
            optimizer=SimpleNamespace(optimizer_type=optimizer),
            precision=SimpleNamespace(dtype=dtype),
        )
        return SimpleNamespace(cfg=cfg)

    state, why = read_optimizer_state(reader("SM3", "fp32"))
    assert state is None and "optimizer 'SM3'" in why
    state, why = read_optimizer_state(reader("Adam", "bf16"))
    assert state is None and "ZeRO with precision bf16" in why


def test_optimizer_state_not_shaped_like_the_parameter_cannot_move():
    from megatron.checkpoint_tools.optimizer_read import _merge_param_state
    from megatron.checkpoint_tools.schema import ModelSchema

    _, keys = model_keys_from_hf(LLAMA)
    schema = ModelSchema(args_from(keys))
    name = "2.mlp.dense_4h_to_h.weight"  # (64, 96), split along dim 1 over tp
    adam = [{"step": torch.tensor(3.0), "exp_avg": torch.full((64, 48), float(r))} for r in (0, 1)]
    merged = _merge_param_state(schema, name, adam)
    assert merged["exp_avg"].shape == (64, 96) and merged["exp_avg"][0, 48] == 1.0
    assert float(merged["step"]) == 3.0
    sm3 = [{"momentum_buffer": torch.zeros(64, 48), "accumulator_0": torch.zeros(64)}] * 2
    assert _merge_param_state(schema, name, sm3) is None


def test_eval_tasks_split_into_names_and_task_folders(tmp_path):
    assert split_tasks([str(tmp_path), "tiny_mc", "hellaswag"]) == (
        ["tiny_mc", "hellaswag"],
        [str(tmp_path)],
    )
    with pytest.raises(ValueError, match="names no lm-eval task"):
        split_tasks([str(tmp_path)])
    assert results_path("out/run") == results_path("out/run", "results.json")
    assert str(results_path("")) == "eval_results.json"
