"""RoPE scaling against Hugging Face transformers (its rotary modules and its Llama), on CPU.

Each rule's cos/sin must equal transformers' at positions inside and beyond the original
length, for whole-head (Llama) and partial (GPT-NeoX) rotary; a tiny Llama with each rule
gives transformers' logits past the original length, in one forward and token by token
through the key/value cache (where dynamic NTK regrows its base at every step), and
`megatron.inference.generate` with dynamic NTK runs to `factor` x max_position_embeddings with
the tokens of transformers' greedy `generate`.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.inference import InferenceModel, SamplingSettings, generate, kv_cache  # noqa: E402
from megatron.model import build_gpt, from_hf, hf_config, load_full_state_dict  # noqa: E402
from megatron.model.positional import RotaryEmbedding  # noqa: E402
from megatron.parallel import ParallelTopology  # noqa: E402
from tests.unit.model.test_hf_parity import llama_args, neox_args, randomise  # noqa: E402

ORIGINAL = 8  # the pre-scaling context; the tests run up to LONG positions
LONG = 21
GEN = torch.Generator()
RULES = {
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
        "beta_fast": 8,
    },
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
        "mscale": 0.7,
        "mscale_all_dim": 0.5,
        "truncate": False,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
    },
}


def scaled(base, rule: str):
    scaling = RULES[rule]
    # dynamic scales from max_position_embeddings on; the others from their original length.
    longest = ORIGINAL if scaling["rope_type"] == "dynamic" else 4 * ORIGINAL
    return dataclasses.replace(
        base, rope_scaling=dict(scaling), max_position_embeddings=longest, seq_length=ORIGINAL
    )


def hf_rotary(arch: str, args):
    config_cls, module = {
        "llama": (transformers.LlamaConfig, transformers.models.llama.modeling_llama),
        "gpt_neox": (transformers.GPTNeoXConfig, transformers.models.gpt_neox.modeling_gpt_neox),
    }[arch]
    config = config_cls(**hf_config(args, arch))
    cls = getattr(
        module, {"llama": "LlamaRotaryEmbedding", "gpt_neox": "GPTNeoXRotaryEmbedding"}[arch]
    )
    return cls(config)


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
@pytest.mark.parametrize("length", [ORIGINAL - 3, LONG])
def test_cos_sin_equal_transformers(rule, arch, length):
    args = scaled(llama_args() if arch == "llama" else neox_args(0.5, True), rule)
    positions = torch.arange(length).expand(2, length)
    # A fresh module per length: transformers' dynamic module remembers its longest call.
    hf_cos, hf_sin = hf_rotary(arch, args)(torch.zeros(1, dtype=torch.float32), positions)
    cos, sin = RotaryEmbedding(args).cos_sin(positions)  # (s, b, 1, rot)
    torch.testing.assert_close(cos[:, :, 0].transpose(0, 1), hf_cos, rtol=0, atol=2e-6)
    torch.testing.assert_close(sin[:, :, 0].transpose(0, 1), hf_sin, rtol=0, atol=2e-6)
    if length > ORIGINAL:  # the rule does change the angles there
        plain, _ = RotaryEmbedding(dataclasses.replace(args, rope_scaling=None)).cos_sin(positions)
        assert (plain - cos).abs().max() > 1e-3


def twin_llamas(rule: str):
    args = scaled(llama_args(), rule)
    config = transformers.LlamaConfig(**hf_config(args, "llama"))
    config._attn_implementation = "eager"
    hf = transformers.LlamaForCausalLM(config).eval()
    randomise(hf, 5)
    ours = build_gpt(args).eval()
    load_full_state_dict(ours, from_hf(hf.state_dict(), args, "llama"))
    return hf, ours, args


@pytest.mark.parametrize("rule", sorted(RULES))
def test_llama_logits_equal_transformers_beyond_the_original_length(rule):
    hf, ours, args = twin_llamas(rule)
    tokens = torch.randint(
        0, args.vocab_size, (2, LONG), generator=torch.Generator().manual_seed(1)
    )
    positions = torch.arange(LONG).expand(2, LONG)
    with torch.no_grad():
        expected = hf(input_ids=tokens, position_ids=positions).logits
        actual = ours(tokens, positions)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rule", ["dynamic", "yarn"])
def test_cached_generation_steps_equal_transformers(rule):
    # Prefill past the original length, then one token at a time through both caches.
    hf, ours, args = twin_llamas(rule)
    tokens = torch.randint(
        0, args.vocab_size, (1, LONG), generator=torch.Generator().manual_seed(2)
    )
    prefill = ORIGINAL + 2
    with torch.no_grad(), kv_cache(ours):
        out = hf(input_ids=tokens[:, :prefill], use_cache=True)
        past = out.past_key_values
        actual = ours(tokens[:, :prefill], torch.arange(prefill)[None])
        torch.testing.assert_close(actual, out.logits, rtol=1e-5, atol=1e-5)
        for step in range(prefill, LONG):
            out = hf(input_ids=tokens[:, step : step + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            actual = ours(tokens[:, step : step + 1], torch.tensor([[step]]))
            torch.testing.assert_close(actual, out.logits, rtol=1e-5, atol=1e-5)


def test_generate_runs_dynamic_ntk_past_max_positions_with_the_tokens_of_transformers():
    # max_position_embeddings 8 and factor 3: generation may fill 24 positions, each new
    # token through the cache at a grown base, as transformers' greedy generate does.
    hf, ours, args = twin_llamas("dynamic")
    topology, cpu = ParallelTopology(1, 1, world_size=1), torch.device("cpu")
    model = InferenceModel(ours, args, topology, cpu, torch.float32, args.vocab_size)
    prompt = torch.randint(0, args.vocab_size, (1, 5), generator=GEN.manual_seed(3))
    (result,) = generate(model, prompt.tolist(), SamplingSettings(maximum_tokens=100))
    assert len(result.tokens) == 3 * ORIGINAL - 5  # the new tokens, up to the limit
    with torch.no_grad():
        theirs = hf.generate(prompt, max_new_tokens=3 * ORIGINAL - 5, do_sample=False,
                             eos_token_id=None, pad_token_id=0)  # fmt: skip
    assert result.tokens == theirs[0, 5:].tolist()
