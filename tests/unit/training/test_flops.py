"""FLOPs per token against torch's FLOP counter on the models really built; MFU arithmetic.

The reference is `torch.utils.flop_counter.FlopCounterMode` (`tests/flop_counter.py`: with the CPU
attention kernel counted) over forward + backward of:
our model built from a resolved config (shipped GPT-NeoX, Llama and Llama-7B configs, on the
meta device so the 7B shape costs nothing), the Hugging Face model our export builds, and
the `transformers` Llama a Hugging Face import starts from. The counted figure must be within
2% (it is exact: both count matmuls only, attention in full).

A training step of each objective (`step_work`: tokens of the sequences trained on, FLOPs of
every forward and backward, a reference model's forward included) is held to the counter over
one real step of the product on one gloo rank: the engines, the objective's inputs from its
samples, the reference model filling them in, the step driver.

A sliding window is counted as what the math needs, W + 1 keys per query (flops.py): our
backends compute the whole score matrix and mask it, so the counter sees the window only where
every query's keys are all in it, a sequence of W + 1 tokens; and the 7B-shaped figure is
checked against the formula written out here.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from megatron.checkpoint_tools.hf_export import hf_config_object
from megatron.checkpoint_tools.hf_import import RECORD_DEFAULTS, model_keys_from_hf
from megatron.config import config_from_dict, load_config
from megatron.model import ModelArgs
from megatron.training.metrics.flops import (
    ModelShape,
    peak_description,
    peak_tflops,
    shape_from_config,
    step_work,
    throughput,
    training_flops_per_token,
)
from tests.distributed import run_distributed
from tests.flop_counter import counted_training_flops_per_token, flop_counter

# One process, no recomputation: model FLOPs count no recompute (see flops.py), and torch
# would count DeepSpeed's recomputed forward.
PLAIN = ["model_parallel_size=1", "pipe_parallel_size=0", "checkpoint_activations=false"]


def _counted_hf(model: torch.nn.Module, seq: int) -> float:
    tokens = torch.zeros(1, seq, dtype=torch.long, device="meta")
    with flop_counter() as counter:
        model(input_ids=tokens).logits.float().sum().backward()
    return counter.get_total_flops() / seq


@pytest.mark.parametrize(
    "files, overrides",
    [
        (["160M"], []),  # GPT-NeoX/Pythia: gelu, parallel residual, untied, SDPA
        (["llama-small"], []),  # Llama: GQA 8/2, SwiGLU rounded to 32, untied
        (["llama-small"], ["activation=geglu", "intermediate_size=1000", "no_weight_tying=false"]),
        (["small"], ["activation=reglu", "attention_config=[[['global'], 4]]"]),
        (["small"], ["attention_config=[[['gmlp', 'amlp'], 'all']]", "pos_emb=rpe"]),
        (["small"], ["attention_config=[[['amlp', 'global'], 2]]", "gmlp_attn_dim=16"]),
        (["llama-7B"], []),  # 7B: intermediate_size 32768 -> 11008 per gated branch
    ],
)
def test_training_flops_match_the_flop_counter_on_our_model(files, overrides):
    cfg = load_config(files, PLAIN + overrides, world_size=1, vocab_size=32000)
    args = ModelArgs.from_config(cfg)
    expected = counted_training_flops_per_token(args, cfg.model.seq_length)
    assert training_flops_per_token(shape_from_config(cfg)) == pytest.approx(expected, rel=0.02)


def test_rwkv_layers_count_their_matmuls_and_the_recurrence(monkeypatch):
    # The counter sees the projections; the WKV recurrence (4 · dim_att · head_size per token,
    # flops.py) is swapped for an elementwise stand-in, since our chunked form computes it in
    # another (larger) number of multiplies than the recurrence needs.
    import megatron.model.rwkv as rwkv

    monkeypatch.setattr(rwkv, "wkv6", lambda r, k, v, w, u, state: (r * k * v * w, state))
    types = ("rwkv", "global", "rwkv")
    args = ModelArgs(
        num_layers=3,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=256,
        seq_length=32,
        layer_attention_types=types,
        dim_att=128,
        ffn_dim=96,
    )
    recurrence = 2 * 3 * (2 * 2 * 128 * 32)  # two rwkv layers, forward + backward
    expected = counted_training_flops_per_token(args, 32) + recurrence
    assert training_flops_per_token(ModelShape.from_args(args)) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("arch", ["gpt_neox", "llama"])
def test_training_flops_match_the_flop_counter_on_the_hf_export(arch):
    files = {"gpt_neox": ["160M"], "llama": ["llama-small"]}[arch]
    cfg = load_config(files, PLAIN, world_size=1, vocab_size=50277)
    args = ModelArgs.from_config(cfg)
    config = hf_config_object(args, arch, None, torch.float32)
    config._attn_implementation = "eager"  # explicit q k^T and probs v matmuls
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
        counted = _counted_hf(model, cfg.model.seq_length)
    assert training_flops_per_token(ModelShape.from_args(args)) == pytest.approx(counted, rel=0.02)


def test_training_flops_of_an_imported_llama_match_transformers():
    hf = dict(
        model_type="llama",
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
        hidden_act="silu",
        tie_word_embeddings=False,
    )
    _, keys = model_keys_from_hf(hf)
    cfg = config_from_dict({**keys, **RECORD_DEFAULTS}, vocab_size=32000)
    config = transformers.LlamaConfig(**{k: v for k, v in hf.items() if k != "model_type"})
    config._attn_implementation = "eager"
    with torch.device("meta"):
        counted = _counted_hf(transformers.LlamaForCausalLM(config), 256)
    assert training_flops_per_token(shape_from_config(cfg)) == pytest.approx(counted, rel=0.02)


def test_training_is_6n_plus_full_causal_attention():
    """PaLM's model FLOPs, written here: 6 N (matmul weights) + 12 L s h (attention, full)."""
    cfg = load_config(["llama-7B"], PLAIN, world_size=1, vocab_size=32000)
    h, layers, seq, f, v = 4096, 32, 4096, 11008, 32000
    n_matmul = layers * (4 * h * h + 3 * h * f) + h * v
    expected = 6 * n_matmul + 12 * layers * seq * h
    assert training_flops_per_token(shape_from_config(cfg)) == expected


def test_a_shorter_step_counts_its_own_attention():
    """A curriculum step of 1024 tokens: the same 6 N, attention over 1024 keys (PaLM's)."""
    cfg = load_config(["llama-7B"], PLAIN, world_size=1, vocab_size=32000)
    h, layers, seq, f, v = 4096, 32, 1024, 11008, 32000
    n_matmul = layers * (4 * h * h + 3 * h * f) + h * v
    work = step_work(cfg, seq_length=seq)
    assert work.tokens == cfg.training.train_batch_size * seq
    assert work.flops_per_token == 6 * n_matmul + 12 * layers * seq * h


# Mistral-7B's shape on NeoX's Llama-7B config: GQA 32/8, SwiGLU 14336 per branch
# (int(2/3 · 43008) // 2), 32k tokens, Hugging Face's sliding_window 4096 + 1.
MISTRAL_7B = ["num_kv_heads=8", "intermediate_size=43008", "seq_length=32768",
              "max_position_embeddings=32768", "sliding_window_width=4096"]  # fmt: skip


def test_a_sliding_window_counts_the_window_not_the_sequence():
    """6 N + 12 L k h with k = W + 1 keys per query (PaLM's formula, attention over the window)."""
    cfg = load_config(["llama-7B"], PLAIN + MISTRAL_7B, world_size=1, vocab_size=32000)
    h, layers, kv, f, v, seq, window = 4096, 32, 1024, 14336, 32000, 32768, 4096
    n_matmul = layers * (2 * h * h + 2 * h * kv + 3 * h * f) + h * v
    expected = 6 * n_matmul + 12 * layers * (window + 1) * h
    assert training_flops_per_token(shape_from_config(cfg)) == expected
    full = 6 * n_matmul + 12 * layers * seq * h  # what the count said before: 1.9x
    assert full / expected == pytest.approx(1.92, abs=0.01)


@pytest.mark.parametrize("attention", ["global", "sdpa"])
def test_a_sliding_window_matches_the_counter_where_every_key_is_in_the_window(attention):
    window, seq = 15, 64
    overrides = [f"sliding_window_width={window}", f"attention_config=[[['{attention}'], 'all']]"]
    cfg = load_config(["llama-small"], PLAIN + overrides, world_size=1, vocab_size=32000)
    args = ModelArgs.from_config(cfg)
    args = dataclasses.replace(args, seq_length=seq, max_position_embeddings=seq)
    # the last query sees W + 1 keys, all unmasked
    counted = counted_training_flops_per_token(args, window + 1)
    assert training_flops_per_token(ModelShape.from_args(args)) == pytest.approx(counted, rel=1e-9)
    # the backend itself computes all s × s scores
    assert counted_training_flops_per_token(args, seq) > counted


# (train_impl, extra keys): pairwise with a reference (DPO), one sequence with a reference
# (KTO), pairwise without one (reward model; reference-free DPO), the language model.
STEPS = [
    ("dpo", {}),
    ("kto", {}),
    ("rm", {}),
    ("dpo", {"dpo_reference_free": True}),
]


def _one_step_counted(rank, world_size, runs):
    """Per run: (torch's count over one train step of the product, `step_work`'s FLOPs)."""
    import deepspeed

    from megatron.parallel import ParallelTopology
    from megatron.training.objectives import build_objective
    from megatron.training.objectives.reference import build_reference
    from megatron.training.setup.batches import BatchSettings, ModelBatches
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.steps import engine_steps
    from tests.parallel.test_post_training_parity import _config, _samples

    deepspeed.init_distributed(dist_backend="gloo")
    results = []
    for train_impl, keys in runs:
        cfg = _config("dpo", 1, 0, 0, False, "fp32", world_size).replace(
            train_impl=train_impl, **keys
        )
        topo = ParallelTopology.from_config(cfg)
        goal = build_objective(cfg, topo.tp_group)
        reference = build_reference(cfg, topo, goal)
        engine = build_engine(cfg, topo, 1, goal).engine
        steps = engine_steps(engine, topo, goal, reference)
        kind = "kto" if train_impl == "kto" else "dpo"
        samples = [_samples(kind, 0, i) for i in range(engine.gradient_accumulation_steps())]
        if kind == "dpo":  # the reward model reads its reward at the last labelled token
            samples = [{**sample, "neg_label": sample["pos_label"]} for sample in samples]
        batches = ModelBatches(iter(samples), BatchSettings(), None, goal)
        with flop_counter() as counter:
            steps.train_step(batches)
        work = step_work(cfg, goal)
        results.append((counter.get_total_flops(), work.flops, work.tokens))
    return results


@pytest.mark.slow  # one spawned rank building six tiny engines
def test_a_step_of_every_objective_counts_what_ran():
    [results] = run_distributed(_one_step_counted, 1, STEPS, timeout=600)
    tokens = {name: tokens for (name, keys), (_, _, tokens) in zip(STEPS, results)}
    assert tokens["kto"] == 8 * 16  # 8 sequences of 16 tokens per step
    assert tokens["dpo"] == tokens["rm"] == 2 * 8 * 16  # 8 pairs: 16 sequences
    for (name, keys), (counted, work, _) in zip(STEPS, results):
        assert work == pytest.approx(counted, rel=1e-9), (name, keys)


def test_peak_by_device_and_matmul_precision():
    assert peak_tflops("bf16", device_name="NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("bf16", device_name="NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("fp16", device_name="NVIDIA A100-SXM4-40GB") == 312.0
    assert peak_tflops("bf16", device_name="Tesla V100-SXM2-32GB") is None
    assert peak_tflops("bf16", device_name="Some Future Accelerator") is None
    assert peak_tflops("bf16", override=100.0, device_name="cpu") == 100.0
    # fp32 matmuls run on TF32 tensor cores only when torch is told to (off by default).
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        matmul.allow_tf32 = False
        assert peak_tflops("fp32", device_name="NVIDIA A100-SXM4-80GB") == 19.5
        matmul.allow_tf32 = True
        assert peak_tflops("fp32", device_name="NVIDIA A100-SXM4-80GB") == 156.0
    finally:
        matmul.allow_tf32 = before


def test_the_start_up_report_says_which_peak():
    h100 = peak_description("bf16", device_name="NVIDIA H100 80GB HBM3")
    assert h100 == "MFU against 989 TFLOP/s per device (NVIDIA H100 80GB HBM3, dense bf16)"
    assert "set peak_theoretical_tflops" in peak_description("fp32", device_name="CPU")
    assert "(peak_theoretical_tflops)" in peak_description("bf16", 120.0)


def test_throughput_and_mfu():
    t = throughput(tokens=4000, seconds=2.0, flops_per_token=1e9, world_size=2, peak=10.0)
    assert t.tokens_per_sec == 2000.0
    assert t.tflops_per_gpu == pytest.approx(1.0)
    assert t.mfu == pytest.approx(0.1)
    assert throughput(10, 1.0, 1e9, 1, None).mfu is None
