"""The `rope_scaling` key: refused when malformed (naming the file), and carried losslessly
from a Hugging Face Llama or GPT-NeoX directory into our checkpoint and back out."""

from __future__ import annotations

import json

import pytest
import torch

from megatron.config.resolve import load_config
from megatron.config.schema import ConfigError
from megatron.model import ModelArgs

transformers = pytest.importorskip("transformers")

from megatron.checkpoint_tools import CheckpointReader, export_hf, import_hf  # noqa: E402
from megatron.checkpoint_tools.hf_import import model_keys_from_hf  # noqa: E402

BASE = """num_layers: 2
hidden_size: 32
num_attention_heads: 4
seq_length: 64
pos_emb: {pos_emb}
train_micro_batch_size_per_gpu: 1
lr: 1.0e-4
rope_scaling: {scaling}
"""
YARN = "{rope_type: yarn, factor: 4.0, original_max_position_embeddings: 16}"


def load(tmp_path, scaling: str, pos_emb: str = "rotary"):
    path = tmp_path / "model.yml"
    path.write_text(BASE.format(scaling=scaling, pos_emb=pos_emb))
    return load_config([path], world_size=1, vocab_size=128), path


@pytest.mark.parametrize(
    "scaling, pos_emb, message",
    [
        ("{rope_type: ntk, factor: 2.0}", "rotary", "rope_type 'ntk' is not supported; valid: "),
        ("{type: linear, factor: 2.0}", "rotary", "write the rule as rope_type"),
        ("{rope_type: yarn, factor: 4.0}", "rotary", r"missing \['original_max_position_emb"),
        ("{rope_type: linear, factor: 0.5}", "rotary", "factor 0.5 is not valid: .* >= 1"),
        ("{rope_type: dynamic, factor: 2.0, beta_fast: 4}", "rotary", r"does not take \['beta"),
        (YARN, "learned", "needs pos_emb rotary, not learned"),
        (
            "{rope_type: llama3, factor: 8, low_freq_factor: 4, high_freq_factor: 1, "
            "original_max_position_embeddings: 16}",
            "rotary",
            "high_freq_factor 1 must exceed low_freq_factor 4",
        ),
    ],
)
def test_malformed_rope_scaling_is_refused_naming_the_file(tmp_path, scaling, pos_emb, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load(tmp_path, scaling, pos_emb)
    assert "model.yml" in str(caught.value) and "rope_scaling" in str(caught.value)


def test_a_valid_rule_reaches_the_model(tmp_path):
    cfg, _ = load(tmp_path, YARN)
    args = ModelArgs.from_config(cfg)
    assert args.rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
    }


HF_RULES = [
    ("llama", {"rope_type": "linear", "factor": 2.0}),
    ("llama", {"rope_type": "dynamic", "factor": 4.0}),
    (
        "llama",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    (
        "gpt_neox",
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "attention_factor": 1.25,
            "beta_fast": 16.0,
            "truncate": False,
        },
    ),
]


def tiny_hf(arch: str, rule: dict):
    common = dict(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=64,
        rope_parameters={**rule, "rope_theta": 10000.0},
    )
    if arch == "llama":
        config = transformers.LlamaConfig(intermediate_size=48, **common)
    else:
        common["rope_parameters"]["partial_rotary_factor"] = 0.5
        config = transformers.GPTNeoXConfig(intermediate_size=128, **common)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("arch, rule", HF_RULES, ids=[r["rope_type"] for _, r in HF_RULES])
def test_hf_to_ours_to_hf_keeps_the_rope_rule(arch, rule, tmp_path):
    tiny_hf(arch, rule).save_pretrained(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "ours")
    reader = CheckpointReader(tmp_path / "ours")
    assert reader.args.rope_scaling == rule  # our key holds the rule's fields, no more
    snippet = json.loads((tmp_path / "ours" / "hf_import.yml").read_text())
    assert snippet["rope_scaling"] == rule
    export_hf(reader.state_dict(), reader.args, tmp_path / "back", architecture=arch)
    before = json.loads((tmp_path / "hf" / "config.json").read_text())
    after = json.loads((tmp_path / "back" / "config.json").read_text())
    # (Llama's config leaves out the whole-head fraction; the export writes it.)
    assert after["rope_parameters"] == {"partial_rotary_factor": 1.0, **before["rope_parameters"]}
    assert after["max_position_embeddings"] == before["max_position_embeddings"]


def test_legacy_rope_scaling_dict_is_read_as_the_same_rule():
    hf = tiny_hf("llama", {"rope_type": "default"}).config.to_dict()
    hf.pop("rope_parameters")
    hf.update(rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0})
    _, keys = model_keys_from_hf(hf)
    assert keys["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize(
    "rope, message",
    [
        ({"rope_type": "longrope", "factor": 2.0}, "rope_type 'longrope' is not supported"),
        ({"rope_type": "yarn", "factor": None}, r"missing \['factor'\]"),
        ({"rope_type": "linear", "factor": 2.0, "mystery": 1}, r"does not take \['mystery'\]"),
    ],
)
def test_hf_rope_rules_we_cannot_express_are_refused(rope, message):
    hf = tiny_hf("llama", {"rope_type": "default"}).config.to_dict()
    hf["rope_parameters"] = {**rope, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match=message):
        model_keys_from_hf(hf)
