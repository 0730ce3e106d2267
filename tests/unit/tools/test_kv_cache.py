"""Generation in one process: the key/value cache gives the logits and tokens of recomputing
the whole sequence (GPT-NeoX- and Llama-style models, SDPA layers, batches), ALiBi falls back
to recomputing, and length limits end a sample."""

from __future__ import annotations

import pytest
import torch

from megatron.inference import (
    InferenceModel,
    SamplingSettings,
    generate,
    kv_cache,
    supports_kv_cache,
)
from megatron.model import ModelArgs, build_gpt
from megatron.parallel import ParallelTopology

BASE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=64, seq_length=24)
ARGS = {
    "neox": dict(pos_emb="rotary", rotary_pct=0.5, gpt_j_residual=True),
    "llama": dict(
        pos_emb="rotary",
        norm="rmsnorm",
        activation="swiglu",
        num_kv_heads=2,
        no_weight_tying=True,
        use_bias_in_attn_linear=False,
        layer_attention_types=("sdpa", "global"),
    ),
    "learned": dict(pos_emb="learned"),
    "alibi": dict(pos_emb="alibi"),
    "rpe": dict(pos_emb="rpe"),
    "gmlp": dict(layer_attention_types=("amlp", "global"), gmlp_attn_dim=8),
}


def tiny_model(kind: str) -> InferenceModel:
    args = ModelArgs(**BASE, **ARGS[kind], seed=5)
    module = build_gpt(args)
    with torch.no_grad():  # larger weights than the init, so the logits are far from uniform
        for p in module.parameters():
            p.mul_(4.0)
    topology = ParallelTopology(1, 1, world_size=1)
    return InferenceModel(
        module, args, topology, torch.device("cpu"), torch.float32, args.vocab_size
    )


def positions(start: int, stop: int, batch: int = 2) -> torch.Tensor:
    return torch.arange(start, stop).expand(batch, stop - start)


@pytest.mark.parametrize("kind", ["neox", "llama", "learned"])
def test_cached_steps_give_the_logits_of_the_full_sequence(kind):
    model = tiny_model(kind)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    full = model.forward(tokens, positions(0, 9))
    with kv_cache(model.module):
        steps = [model.forward(tokens[:, :5], positions(0, 5))]
        for i in range(5, 9):
            steps.append(model.forward(tokens[:, i : i + 1], positions(i, i + 1)))
    cached = torch.cat(steps, dim=1)  # (b, 9, V)
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)
    assert not any(type(m).__name__ == "CachedAttention" for m in model.module.modules())


@pytest.mark.parametrize("kind", ["neox", "llama", "alibi", "rpe", "gmlp"])
def test_cache_and_recompute_generate_the_same_tokens(kind):
    model = tiny_model(kind)
    prompts = [[3, 9, 27, 17], [60, 1, 5, 44], [8]]
    cached = generate(model, prompts, SamplingSettings(maximum_tokens=10), batch_size=2)
    recomputed = generate(model, prompts, SamplingSettings(maximum_tokens=10, recompute=True))
    assert [g.tokens for g in cached] == [g.tokens for g in recomputed]
    assert [g.prompt for g in cached] == prompts
    assert all(len(g.tokens) == 10 and not g.finished for g in cached)
    assert len({tuple(g.tokens) for g in cached}) > 1
    assert supports_kv_cache(model.args) == (kind in ("neox", "llama"))


def test_end_of_document_and_the_position_limit_end_a_sample():
    model = tiny_model("neox")
    first = generate(model, [[3, 9, 27, 17]], SamplingSettings(maximum_tokens=5))[0].tokens
    stop = generate(model, [[3, 9, 27, 17]], SamplingSettings(maximum_tokens=5, eod=first[2]))
    assert stop[0].tokens == first[: first.index(first[2])] and stop[0].finished
    long_prompt = list(range(1, 21))  # seq_length 24 leaves room for 4 tokens
    assert len(generate(model, [long_prompt], SamplingSettings(maximum_tokens=50))[0].tokens) == 4
    cut = generate(model, [list(range(40))], SamplingSettings(maximum_tokens=3))[0]
    assert cut.prompt == list(range(40))[-23:] and len(cut.tokens) == 1
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, [[]], SamplingSettings())
