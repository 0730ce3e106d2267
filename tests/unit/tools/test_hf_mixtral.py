"""Hugging Face Mixtral against `transformers`, on CPU in fp32.

A tiny random `MixtralForCausalLM` (2 layers, 4 experts, top-2, hidden 64, a window shorter
than the sequence; norm weights randomised too):

- imported with `import_hf` at (tp=2, pp=2) (expert-parallel size 1: checkpoints with
  `moe_expert_parallel_size > 1` are refused, see `megatron/config/moe.py`) and read back:
  logits equal transformers' within 1e-5, and cached greedy decoding gives the tokens of
  transformers' greedy `generate`;
- exported back with `export_hf`: every tensor of the files and the config keys equal;
- routers Mixtral cannot express (Sinkhorn, GPT-NeoX's unnormalised weights, token dropping,
  dense layers between MoE ones, expert biases) are refused on export.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from megatron.checkpoint_tools import CheckpointReader, export_hf, import_hf  # noqa: E402
from megatron.checkpoint_tools.hf_import import model_keys_from_hf  # noqa: E402
from megatron.model import build_gpt, hf_config, load_full_state_dict  # noqa: E402
from tests.unit.tools.test_hf_families import greedy_with_cache  # noqa: E402

VOCAB, SEQ, NEW = 128, 12, 6


def random_mixtral():
    config = transformers.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=32,
        rms_norm_eps=1e-6,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=6,
        router_aux_loss_coef=0.02,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.2 * noise)
    return model


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixtral")
    hf = random_mixtral()
    hf.save_pretrained(folder / "hf")
    import_hf(folder / "hf", folder / "ours", tp=2, pp=2)
    reader = CheckpointReader(folder / "ours")
    ours = build_gpt(dataclasses.replace(reader.args, pipe_parallel_size=0)).eval()
    load_full_state_dict(ours, reader.state_dict())
    return hf, ours, reader, folder


def test_imported_at_tp2_pp2_gives_transformers_logits(imported):
    hf, ours, reader, _ = imported
    assert (reader.layout.tp, reader.layout.pp) == (2, 2)
    args = reader.args
    assert (args.moe_num_experts, args.moe_top_k, args.expert_interval) == (4, 2, 1)
    assert args.moe_router_weights == "softmax_renormalized"
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(SEQ).expand(2, SEQ)
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        actual = ours(tokens, positions)[..., :VOCAB]
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_greedy_tokens_equal_transformers_generate(imported):
    hf, ours, _, _ = imported
    prompt = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = hf.generate(prompt, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                             pad_token_id=0)  # fmt: skip
    assert greedy_with_cache(ours, prompt, NEW) == theirs[:, 7:].tolist()


def test_export_gives_back_the_hf_model_exactly(imported):
    _, _, reader, folder = imported
    back = folder / "back"
    result = export_hf(reader.state_dict(), reader.args, back, vocab_size=VOCAB)
    assert result.architecture == "mixtral"  # chosen by `auto`: the model has experts
    original = safetensors_torch.load_file(folder / "hf" / "model.safetensors")
    converted = safetensors_torch.load_file(back / "model.safetensors")
    assert sorted(converted) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(converted[name], tensor), name
    before = json.loads((folder / "hf" / "config.json").read_text())
    after = json.loads((back / "config.json").read_text())
    skip = {"bos_token_id", "eos_token_id", "transformers_version"}
    # every export states the rotary fraction; 1.0 is transformers' value when absent
    before["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    assert {k: v for k, v in after.items() if k not in skip} == {
        k: v for k, v in before.items() if k not in skip
    }
    assert model_keys_from_hf(after) == model_keys_from_hf(before)


@pytest.mark.parametrize(
    "change, option",
    [
        (dict(moe_router_type="sinkhorn"), "moe_router_type"),
        (dict(moe_router_weights="softmax"), "moe_router_weights"),
        (dict(moe_token_dropping=True), "moe_token_dropping"),
        (dict(expert_interval=2), "expert_interval"),
        (dict(use_bias_in_mlp=True), "use_bias_in_mlp"),
        (dict(moe_type="deepspeed"), "moe_type"),
    ],
)
def test_export_refuses_routers_mixtral_cannot_express(imported, change, option):
    args = dataclasses.replace(imported[2].args, **change)
    with pytest.raises(ValueError, match=f"MixtralForCausalLM.*{option}"):
        hf_config(args, "mixtral")


def test_other_classes_refuse_experts(imported):
    with pytest.raises(ValueError, match="moe_num_experts"):
        hf_config(imported[2].args, "mistral")
