"""Hugging Face Mixtral against `transformers`, on CPU in fp32.

A tiny random `MixtralForCausalLM` (2 layers, 4 experts, top-2, hidden 64, a window shorter
than the sequence; norm weights randomised too):

- imported with `import_hf` at (tp=2, pp=2), at expert-parallel size 1 and 2, and read back:
  logits equal transformers' within 1e-5, and cached greedy decoding gives the tokens of
  transformers' greedy `generate`; at ep 2 DeepSpeed's layer files hold experts 0-1 of each
  layer and `expert_states_pp{stage}_ep1.pt` experts 2-3, as training saves them;
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

from megatron.checkpoint_tools import export_hf  # noqa: E402
from megatron.checkpoint_tools.hf_import import model_keys_from_hf  # noqa: E402
from megatron.model import hf_config  # noqa: E402
from tests.unit.tools.hf_tiny import (  # noqa: E402
    assert_logits_equal,
    greedy_with_cache,
    import_and_read,
    randomise,
    transformers_greedy,
)

VOCAB, NEW = 128, 6


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
    return randomise(transformers.MixtralForCausalLM(config))


@pytest.fixture(scope="module", params=[1, 2], ids=["ep1", "ep2"])
def imported(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"mixtral_ep{request.param}")
    hf = random_mixtral()
    ours, reader = import_and_read(hf, folder, ep=request.param)
    return hf, ours, reader, folder


def test_ep2_files_are_the_slices_training_saves(imported):
    """DeepSpeed's layer files: experts 0-1; the expert files: experts 2-3 of each stage."""
    _, _, reader, _ = imported
    ep = reader.cfg.moe.moe_expert_parallel_size
    step = reader.folder
    expert_files = sorted(p.name for p in step.glob("expert_states_*"))
    if ep == 1:
        assert expert_files == []
        return
    assert expert_files == ["expert_states_pp0_ep1.pt", "expert_states_pp1_ep1.pt"]
    layer = reader.schema.spec(next(n for n in reader.schema.params if ".experts.w_gate" in n))
    for t in (0, 1):  # experts are whole on every tensor-parallel rank
        saved = torch.load(step / f"layer_{layer.layer:02d}-model_{t:02d}-model_states.pt")
        assert saved[layer.local].shape[0] == 2
    rest = torch.load(step / "expert_states_pp0_ep1.pt")
    assert rest["ep_size"] == 2 and rest["optimizer"] == {}
    both = torch.cat([saved[layer.local], rest["params"][layer.name]])
    assert torch.equal(both, reader.state_dict([layer.name])[layer.name])


def test_imported_at_tp2_pp2_gives_transformers_logits(imported):
    hf, ours, reader, _ = imported
    args = reader.args
    assert (args.moe_num_experts, args.moe_top_k, args.moe_expert_interval) == (4, 2, 1)
    assert args.moe_router_weights == "softmax_renormalized"
    assert_logits_equal(hf, ours, VOCAB)


def test_greedy_tokens_equal_transformers_generate(imported):
    hf, ours, _, _ = imported
    prompt = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
    assert greedy_with_cache(ours, prompt, NEW, VOCAB) == transformers_greedy(hf, prompt, NEW)


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
        (dict(moe_expert_interval=2), "moe_expert_interval"),
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
