"""Prompt sources of generate.py, and work shared over data-parallel replicas: two gloo ranks
at dp=2 generate and score exactly what one replica computes alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron.inference.text import InputFile, Unconditional, prompt_source
from tests.distributed import run_distributed
from tests.tiny import HF_VOCAB, arch_settings, resolve


def generation_cfg(**values):
    defaults = dict(num_samples=3, sample_input_file=None, prompt_end="\n")
    return SimpleNamespace(generation=SimpleNamespace(**{**defaults, **values}))


def test_prompt_sources(tmp_path):
    assert list(Unconditional().batches(generation_cfg())) == [["", "", ""]]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\n\n  second one  \nthird")
    assert list(InputFile().batches(generation_cfg(sample_input_file=str(prompts)))) == [
        ["first prompt", "second one", "third"]
    ]
    prompts.write_text("a|b c|")
    cfg = generation_cfg(sample_input_file=str(prompts), prompt_end="|")
    assert list(InputFile().batches(cfg)) == [["a", "b c"]]
    with pytest.raises(ValueError, match="sample_input_file"):
        list(InputFile().batches(generation_cfg()))
    with pytest.raises(ValueError, match="text_gen_type 'precompute'"):
        prompt_source("precompute")


def _replicas(rank, world_size, settings):
    import builtins

    import torch

    from megatron.data import build_tokenizer
    from megatron.evaluation.adapter import MegatronLM
    from megatron.inference import InferenceModel, SamplingSettings
    from megatron.inference.model import inference_config
    from megatron.inference.text import Interactive, run_prompts
    from megatron.launcher.worker import initialize_distributed
    from megatron.model import build_model

    # the model as generate.py builds it: a head that writes logits
    cfg = inference_config(resolve(settings, world_size, vocab_size=HF_VOCAB))
    topology = initialize_distributed(cfg)
    module = build_model(cfg, topology)  # the same seeded weights on both replicas
    tokenizer = build_tokenizer(cfg)
    model = InferenceModel(
        module, module.args, topology, torch.device("cpu"), torch.float32, tokenizer.vocab_size
    )
    texts = ["the king", "ships of many", "wine and bread", "a far land", "dawn"]
    greedy = SamplingSettings(maximum_tokens=4, eod=tokenizer.eod)
    shared = run_prompts(model, tokenizer, texts, greedy, prompt_source("input-file"), None)
    alone = [run_prompts(model, tokenizer, [t], greedy, Interactive(), None)[0] for t in texts]

    lm = MegatronLM(model, tokenizer, batch_size=2)
    pairs = [([5, 6, 7], [8, 9]), ([11], [12, 13, 14]), ([20, 21], [22]), ([3], [4])]
    scored = lm._score(pairs)
    direct = lm._score_batch(pairs)

    answers = iter(["the king", ""])
    builtins.input = lambda prompt="": next(answers)
    typed = list(Interactive().batches(cfg))
    return topology.dp_size, shared, alone, scored, direct, typed


def test_replicas_share_generation_and_scoring_and_rank0_reads_the_terminal(tmp_path):
    settings = arch_settings(tmp_path, "llama", tp=1, pp=1, load=None, save=None)
    for dp, shared, alone, scored, direct, typed in run_distributed(_replicas, 2, settings):
        assert dp == 2
        assert [r["context"] for r in shared] == [r["context"] for r in alone]
        assert [r["tokens"] for r in shared] == [r["tokens"] for r in alone]
        assert [s for s, _ in scored] == pytest.approx([s for s, _ in direct], abs=1e-5)
        assert [g for _, g in scored] == [g for _, g in direct]
        assert typed == [["the king"]]
