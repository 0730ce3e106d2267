"""Hugging Face conversion end to end on CPU, fp32.

- Trained at (tp=2, pp=2), exported with `tools/convert_to_hf.py`, loaded with
  `transformers.AutoModelForCausalLM`: logits equal ours at (2, 2) within 1e-5, and HF's
  greedy `generate` gives the tokens our generation gives, for GPT-NeoX (tied, parallel
  residual, partial rotary) and Llama (RMSNorm, SwiGLU, GQA, untied, no biases) models.
- A Hugging Face model (GPT-NeoX, Llama, Mistral, Qwen2, Qwen3) -> `tools/convert_from_hf.py`
  at (2, 2) -> `convert_to_hf.py` gives back exactly the same tensors, settings and tokenizer.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.tiny import HF_TOKENIZER, HF_VOCAB
from tests.unit.tools.tiny_checkpoints import MAX_NEW, PROBE, PROMPTS, trained

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.slow

HF_CLASSES = {"neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM"}


def convert_to_hf(*argv: str) -> None:
    from tools import convert_to_hf as tool

    assert tool.main(list(argv)) == 0


def convert_from_hf(*argv: str) -> None:
    from tools import convert_from_hf as tool

    assert tool.main(list(argv)) == 0


@pytest.mark.parametrize("arch", ["neox", "llama"])
def test_export_of_a_tp2_pp2_run_matches_transformers(arch, tmp_path, capsys):
    run = trained()[arch]
    out = tmp_path / "hf"
    step2 = run["folder"] / "ckpt" / "global_step2"
    convert_to_hf("--checkpoint", str(step2), "--output", str(out), "--verify")
    verified = capsys.readouterr().out.split("verify: max |logit difference| vs ours = ")[1]
    assert float(verified.split()[0]) < 1e-5
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [HF_CLASSES[arch]]
    assert (out / "tokenizer.json").read_bytes() == HF_TOKENIZER.read_bytes()

    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = torch.tensor(PROBE)
    with torch.no_grad():
        logits = hf(input_ids=tokens).logits
    # The export keeps the padded rows (as Pythia's do); ours stop at the tokenizer's vocabulary.
    torch.testing.assert_close(logits[..., :HF_VOCAB], run["logits"], rtol=1e-5, atol=1e-5)

    with torch.no_grad():
        generated = hf.generate(
            torch.tensor(PROMPTS),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            suppress_tokens=list(range(HF_VOCAB, hf.config.vocab_size)),  # ours never picks them
        )
    assert generated[:, len(PROMPTS[0]) :].tolist() == run["tokens_recompute=False"]
    assert run["tokens_recompute=True"] == run["tokens_recompute=False"]

    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer("the king rode").input_ids == _ours_tokenize("the king rode")


def _ours_tokenize(text: str) -> list[int]:
    from megatron.data.tokenizers import make_tokenizer

    return make_tokenizer("HFTokenizer", vocab_file=str(HF_TOKENIZER)).tokenize(text)


def _random_hf_model(arch: str):
    gen = torch.Generator().manual_seed(3)
    if arch == "neox":
        config = transformers.GPTNeoXConfig(
            vocab_size=512,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=64,
            rotary_pct=0.25,
            use_parallel_residual=False,
        )
        model = transformers.GPTNeoXForCausalLM(config)
    else:
        config_cls, extra = LLAMA_LIKE[arch]
        config = config_cls(
            vocab_size=512,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=96,
            max_position_embeddings=64,
            rope_theta=500000.0,
            **extra,
        )
        model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # norms too, so no parameter hides behind an identity
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


# The Llama-like families with their attention variants (window, q/k/v biases, QK-norm and a
# head_dim that is not hidden / heads).
LLAMA_LIKE = {
    "llama": (transformers.LlamaConfig, {}),
    "mistral": (transformers.MistralConfig, dict(sliding_window=8)),
    "qwen2": (transformers.Qwen2Config, {}),
    "qwen3": (
        transformers.Qwen3Config,
        dict(head_dim=24, use_sliding_window=True, sliding_window=8, max_window_layers=0),
    ),
}


@pytest.mark.parametrize("arch", ["neox", *LLAMA_LIKE])
def test_hf_to_ours_to_hf_is_lossless(arch, tmp_path):
    source = tmp_path / "hf"
    _random_hf_model(arch).save_pretrained(source)
    (source / "tokenizer.json").write_bytes(HF_TOKENIZER.read_bytes())
    ours, back = tmp_path / "ours", tmp_path / "back"
    convert_from_hf(
        "--hf", str(source), "--output", str(ours),
        "--model-parallel-size", "2", "--pipe-parallel-size", "2",
    )  # fmt: skip
    snippet = json.loads((ours / "hf_import.yml").read_text())
    assert snippet["finetune"] is True and snippet["load"] == str(ours)
    assert (ours / "global_step0" / "layer_00-model_01-model_states.pt").is_file()
    convert_to_hf("--checkpoint", str(ours), "--output", str(back))

    original = safetensors_torch.load_file(source / "model.safetensors")
    converted = safetensors_torch.load_file(back / "model.safetensors")
    assert sorted(converted) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(converted[name], tensor), name
    assert (back / "tokenizer.json").read_bytes() == HF_TOKENIZER.read_bytes()
    before = json.loads((source / "config.json").read_text())
    after = json.loads((back / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "tie_word_embeddings"):
        assert after[key] == before[key], key
    assert after["architectures"] == before["architectures"]
    for key in ("head_dim", "sliding_window", "use_sliding_window", "layer_types"):
        assert after.get(key) == before.get(key), key
    for key, default in (("rope_theta", None), ("rope_type", None), ("partial_rotary_factor", 1.0)):
        rope_after, rope_before = after["rope_parameters"], before["rope_parameters"]
        assert rope_after.get(key, default) == rope_before.get(key, default), key
