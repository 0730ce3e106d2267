"""Hugging Face Mamba (`MambaForCausalLM`) imported and exported, against `transformers`.

A tiny random Mamba model (norms, A_log, D and the step-size bias randomised):

- imported with `import_hf` at pp=2: our logits equal transformers' within 1e-5, and greedy
  decoding by our generation path (which recomputes: Mamba layers keep no key/value cache)
  gives the tokens of transformers' greedy `generate`;
- exported back with `export_hf`: exactly the original tensors and settings;
- what the class cannot express, or we cannot run, is refused with the reason.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from megatron.checkpoint_tools import export_hf  # noqa: E402
from megatron.checkpoint_tools.hf_import import import_hf  # noqa: E402
from megatron.checkpoint_tools.reader import CheckpointReader  # noqa: E402
from megatron.config import ConfigError  # noqa: E402
from megatron.inference.kv_cache import supports_kv_cache  # noqa: E402
from megatron.model import build_gpt, hf_config, load_full_state_dict  # noqa: E402
from tests.unit.tools.hf_tiny import assert_logits_equal, randomise, transformers_greedy  # noqa: E402

VOCAB, NEW = 96, 5


def random_mamba(**changes):
    keys = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, expand=2, **changes)
    torch.manual_seed(0)
    return randomise(transformers.MambaForCausalLM(transformers.MambaConfig(**keys)))


def test_import_equals_transformers_and_export_is_lossless(tmp_path):
    hf = random_mamba(use_conv_bias=False)
    hf.save_pretrained(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "ours", tp=1, pp=2)
    reader = CheckpointReader(tmp_path / "ours")
    args = reader.args
    assert args.layer_attention_types == ("mamba", "mamba") and not supports_kv_cache(args)
    ours = build_gpt(dataclasses.replace(args, pipe_parallel_size=0, loss_chunk_tokens=0))
    load_full_state_dict(ours.eval(), reader.state_dict())
    assert_logits_equal(hf, ours, VOCAB)

    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    tokens = prompt
    with torch.no_grad():  # recompute, as generation does without a cache
        for _ in range(NEW):
            positions = torch.arange(tokens.shape[1]).expand(2, -1)
            step = ours(tokens, positions)[:, -1, :VOCAB].argmax(-1, keepdim=True)
            tokens = torch.cat((tokens, step), dim=1)
    assert tokens[:, 4:].tolist() == transformers_greedy(hf, prompt, NEW)

    out = tmp_path / "exported"
    result = export_hf(reader.state_dict(), args, out, vocab_size=VOCAB)
    assert result.architecture == "mamba"
    saved = safetensors_torch.load_file(out / "model.safetensors")
    original = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert saved.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(saved[name], tensor), name
    config = json.loads((out / "config.json").read_text())
    before = hf.config.to_dict()
    for key in ("expand", "state_size", "conv_kernel", "time_step_rank", "use_conv_bias"):
        assert config[key] == before[key], key


def test_inexpressible_mamba_settings_are_refused(tmp_path):
    hf = random_mamba(use_bias=True)  # in_proj/out_proj biases without an x_proj bias
    hf.save_pretrained(tmp_path / "biased")
    with pytest.raises(ValueError, match="mamba_use_bias_in_linears.*x_proj"):
        import_hf(tmp_path / "biased", tmp_path / "ours")
    random_mamba().save_pretrained(tmp_path / "hf")
    with pytest.raises(ConfigError, match="model_parallel_size 2.*Mamba"):
        import_hf(tmp_path / "hf", tmp_path / "tp2", tp=2)


def test_mixed_models_are_not_mamba_models():
    from megatron.model import ModelArgs

    args = ModelArgs(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=VOCAB,
        seq_length=8,
        layer_attention_types=("mamba", "global"),
        norm="rmsnorm",
        use_bias_in_norms=False,
        pos_emb="none",
    )
    with pytest.raises(ValueError, match="every layer to be 'mamba'"):
        hf_config(args, "mamba")
