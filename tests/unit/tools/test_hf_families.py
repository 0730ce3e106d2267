"""Hugging Face Mistral, Qwen2 and Qwen3 against `transformers`, on CPU in fp32.

For each family a tiny random model (norm weights randomised too, so none hides behind an
identity) exercising its attention variant (Mistral: a window shorter than the sequence;
Qwen2: q/k/v-only biases; Qwen3: QK-norm, an explicit head_dim != hidden/heads, a window):

- imported with `import_hf` at (tp=2, pp=2), read back from that checkpoint: logits equal
  transformers' within 1e-5, and greedy decoding with our key/value cache (the generation
  path of `generate.py`) gives the tokens of transformers' greedy `generate`;
- exported back with `export_hf`: exactly the original tensors and settings (lossless);
- configs the families cannot express are refused, on import and on export.

Greedy tokens of `python deepy.py generate.py` on 4 ranks at (2, 2), per family and Mixtral:
tests/e2e/test_generate_hf_families.py.
"""

from __future__ import annotations

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
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    max_position_embeddings=32,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
FAMILIES = {
    "mistral": (transformers.MistralConfig, dict(sliding_window=5)),
    "qwen2": (transformers.Qwen2Config, dict(use_sliding_window=False)),
    "qwen3": (
        transformers.Qwen3Config,
        dict(head_dim=24, use_sliding_window=True, sliding_window=6, max_window_layers=0),
    ),
}


def random_hf_model(family: str, **changes):
    config_cls, extra = FAMILIES[family]
    config = config_cls(**{**COMMON, **extra, **changes})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomise(transformers.AutoModelForCausalLM.from_config(config))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def imported(request, tmp_path_factory):
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    hf = random_hf_model(family)
    ours, reader = import_and_read(hf, folder)
    return family, hf, ours, reader, folder


def test_imported_at_tp2_pp2_gives_transformers_logits(imported):
    _, hf, ours, _, _ = imported
    assert_logits_equal(hf, ours, VOCAB)


def test_greedy_tokens_equal_transformers_generate(imported):
    family, hf, ours, _, _ = imported
    prompt = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
    # 7 + 6 tokens: past both windows, so cached generation must slide too
    assert greedy_with_cache(ours, prompt, NEW, VOCAB) == transformers_greedy(hf, prompt, NEW)


def test_export_gives_back_the_hf_model_exactly(imported):
    family, hf, _, reader, folder = imported
    back = folder / "back"
    result = export_hf(reader.state_dict(), reader.args, back, vocab_size=VOCAB)
    assert result.architecture == family  # chosen by `auto` from the attention variants
    original = safetensors_torch.load_file(folder / "hf" / "model.safetensors")
    converted = safetensors_torch.load_file(back / "model.safetensors")
    assert sorted(converted) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(converted[name], tensor), name
    before = json.loads((folder / "hf" / "config.json").read_text())
    after = json.loads((back / "config.json").read_text())
    assert after["architectures"] == before["architectures"]
    for key in (
        "head_dim",
        "sliding_window",
        "attention_bias",
        "layer_types",
        "num_key_value_heads",
    ):
        assert after.get(key) == before.get(key), key
    assert model_keys_from_hf(after) == model_keys_from_hf(before)


def test_qwen_window_on_some_layers_only_is_refused():
    config = random_hf_model(
        "qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1
    ).config.to_dict()
    with pytest.raises(ValueError, match=r"layers \[1\] only.*every layer"):
        model_keys_from_hf(config)


def test_export_refuses_what_a_family_cannot_express(imported):
    family, _, _, reader, _ = imported
    others = {"mistral": "qwen2", "qwen2": "qwen3", "qwen3": "mistral"}
    expected = {
        "mistral": "use_bias_in_qkv",  # Qwen2 needs q/k/v biases
        "qwen2": "use_qk_layernorm",  # Qwen3 always normalises q and k
        "qwen3": "use_qk_layernorm",  # Mistral has no QK-norm
    }
    with pytest.raises(ValueError, match=expected[family]):
        hf_config(reader.args, others[family])
    with pytest.raises(ValueError, match="sliding_window_width|use_qk_layernorm|use_bias"):
        hf_config(reader.args, "llama")
