"""Parity with Hugging Face `transformers` on CPU in fp32: same weights, same logits (1e-5).

The HF model is built from a config object (`hf_config` gives its arguments), its weights are
randomised (norms included, so no parameter hides behind an identity), mapped into our model
with the documented rename table (`from_hf`), and both models run the same batch.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.model import (  # noqa: E402
    ModelArgs,
    build_gpt,
    from_hf,
    full_state_dict,
    hf_config,
    load_full_state_dict,
    to_hf,
)

VOCAB, SEQ, BATCH = 96, 12, 2


def randomise(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            is_norm_weight = "norm" in name and name.endswith("weight")
            p.copy_(1.0 + 0.1 * noise if is_norm_weight else 0.1 * noise)


def hf_model(arch: str, args: ModelArgs, seed: int) -> torch.nn.Module:
    cls, config_cls = {
        "gpt_neox": (transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig),
        "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
    }[arch]
    config = config_cls(**hf_config(args, arch))
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config).eval()
    randomise(model, seed)
    return model


def check_parity(arch: str, args: ModelArgs, position_ids=None) -> None:
    hf = hf_model(arch, args, seed=7)
    ours = build_gpt(args).eval()
    load_full_state_dict(ours, from_hf(hf.state_dict(), args, arch))
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))
    if position_ids is None:
        position_ids = torch.arange(SEQ).expand(BATCH, SEQ)
    with torch.no_grad():
        expected = hf(input_ids=tokens, position_ids=position_ids).logits
        actual = ours(tokens, position_ids)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    # The table is invertible: our weights map back onto exactly HF's.
    back = to_hf(full_state_dict(ours), args, arch)
    for name, tensor in hf.state_dict().items():
        assert torch.equal(back[name], tensor), name


def neox_args(rotary_pct: float, parallel_residual: bool, tied: bool = False) -> ModelArgs:
    return ModelArgs(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=VOCAB,
        seq_length=SEQ,
        pos_emb="rotary",
        rotary_pct=rotary_pct,
        gpt_j_residual=parallel_residual,
        no_weight_tying=not tied,
        norm="layernorm",
        activation="gelu",
    )


@pytest.mark.parametrize("rotary_pct", [0.25, 1.0])
@pytest.mark.parametrize("parallel_residual", [True, False])
def test_gpt_neox_logits_match(rotary_pct, parallel_residual):
    check_parity("gpt_neox", neox_args(rotary_pct, parallel_residual))


def test_gpt_neox_tied_embeddings_and_reset_positions_match():
    # Per-row positions (documents packed with position resets) exercise the batched rotary.
    positions = torch.stack([torch.arange(SEQ), torch.arange(SEQ) % 5])
    check_parity("gpt_neox", neox_args(0.5, True, tied=True), position_ids=positions)


def llama_args(**overrides) -> ModelArgs:
    values = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=8,
        num_kv_heads=2,
        vocab_size=VOCAB,
        seq_length=SEQ,
        pos_emb="rotary",
        rotary_pct=1.0,
        rotary_emb_base=500000,
        norm="rmsnorm",
        rms_norm_epsilon=1e-6,
        activation="swiglu",
        intermediate_size=96,
        use_bias_in_norms=False,
        use_bias_in_attn_linear=False,
        use_bias_in_mlp=False,
        no_weight_tying=True,
    )
    values.update(overrides)
    return ModelArgs(**values)


def test_llama_gqa_logits_match():
    check_parity("llama", llama_args())


def test_llama_with_sdpa_backend_matches():
    check_parity("llama", llama_args(layer_attention_types=("sdpa", "flash")))


def test_hf_config_refuses_what_the_architecture_cannot_express():
    with pytest.raises(ValueError, match="activation"):
        hf_config(llama_args(activation="gelu"), "llama")
    with pytest.raises(ValueError, match="num_kv_heads"):
        hf_config(llama_args(), "gpt_neox")
    with pytest.raises(ValueError, match="Hugging Face architecture 'gpt2'"):
        hf_config(llama_args(), "gpt2")
