"""Each Hugging Face family of issue 13, from a tiny random `transformers` model to greedy tokens
of `python deepy.py generate.py` on 4 CPU ranks at (tp=2, pp=2), against transformers' greedy
`generate` on the original model (fp32).

Per family (one deepy run each, the smallest model that still shows its variant): Mistral with
a sliding window shorter than prompt + output (the cache must slide), Qwen2 with q/k/v-only
biases, Qwen3 with QK-norm, `head_dim` != hidden / heads and a window, Mixtral with 4 experts,
top-2 routing and a window. The model goes through `tools/convert_from_hf.py` at (2, 2) and
its `hf_import.yml`, as a user's would. Logits within 1e-5 of transformers' from the split
model at that layout: tests/parallel/test_hf_families_tp2_pp2.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed import free_port
from tests.e2e.test_generate_deepy import PROMPTS, deepy
from tests.tiny import HF_TOKENIZER, HF_VOCAB

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow
NEW, WINDOW = 8, 4
COMMON = dict(
    vocab_size=HF_VOCAB,
    hidden_size=32,
    num_hidden_layers=2,  # one per pipeline stage
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
FAMILIES = {
    "mistral": (transformers.MistralConfig, dict(sliding_window=WINDOW)),
    "qwen2": (transformers.Qwen2Config, dict(use_sliding_window=False)),
    "qwen3": (
        transformers.Qwen3Config,
        dict(head_dim=12, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0),
    ),
    "mixtral": (
        transformers.MixtralConfig,
        dict(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2),
    ),
}


def random_hf_model(family: str, folder):
    """A seeded random model of `family` saved in `folder` with the test tokenizer."""
    config_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_cls(**COMMON, **extra)).eval()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():  # norms too, so no weight hides behind an identity
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.3 * noise)
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes(HF_TOKENIZER.read_bytes())
    return model


def their_greedy_tokens(hf, prompt: list[int], eod: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                          eos_token_id=eod, pad_token_id=eod)  # fmt: skip
    tokens = out[0, len(prompt) :].tolist()
    return tokens[:-1] if tokens and tokens[-1] == eod else tokens  # ours leave it out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generate_py_at_tp2_pp2_gives_transformers_greedy_tokens(family, tmp_path):
    from megatron.data.tokenizers import make_tokenizer
    from tools import convert_from_hf

    hf = random_hf_model(family, tmp_path / "hf")
    ours = tmp_path / "ours"
    argv = ["--hf", str(tmp_path / "hf"), "--output", str(ours),
            "--model-parallel-size", "2", "--pipe-parallel-size", "2"]  # fmt: skip
    assert convert_from_hf.main(argv) == 0
    prompts, samples = tmp_path / "prompts.txt", tmp_path / "samples.jsonl"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    port = free_port()
    config = dict(
        json.loads((ours / "hf_import.yml").read_text()),  # JSON is YAML
        num_gpus=4,
        master_port=port,
        train_micro_batch_size_per_gpu=1,
        text_gen_type="input-file",
        sample_input_file=str(prompts),
        sample_output_file=str(samples),
        maximum_tokens=NEW,
        temperature=0.0,
    )
    assert (config["model_parallel_size"], config["pipe_parallel_size"]) == (2, 2)
    try:
        deepy("generate.py", config, tmp_path)
    finally:  # DeepSpeed's CPU all-reduce leaves its shared-memory buffers behind on exit
        for leftover in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"):
            leftover.unlink(missing_ok=True)
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert [r["context"] for r in records] == PROMPTS

    eod = make_tokenizer("HFTokenizer", vocab_file=str(HF_TOKENIZER)).eod
    for record in records:
        prompt = record["prompt_tokens"]
        assert record["tokens"] == their_greedy_tokens(hf, prompt, eod), record["context"]
    if "sliding_window" in FAMILIES[family][1]:  # some sample ran past the window
        assert max(len(r["prompt_tokens"]) + len(r["tokens"]) for r in records) > WINDOW + 2


def test_mixtral_imported_at_expert_parallel_2_generates_transformers_greedy_tokens(tmp_path):
    """Mixtral through `convert_from_hf.py --expert-parallel-size 2` at (tp=2, pp=2): DeepSpeed's
    files hold experts 0-1, `expert_states_pp*_ep1.pt` experts 2-3; `generate.py` on 2 ranks
    with the import's `moe_expert_parallel_size: 2` (data-parallel 2, tp = pp = 1 to keep it to
    two processes) reads the slices back whole and gives transformers' greedy tokens."""
    from megatron.data.tokenizers import make_tokenizer
    from tools import convert_from_hf

    hf = random_hf_model("mixtral", tmp_path / "hf")
    ours = tmp_path / "ours"
    argv = ["--hf", str(tmp_path / "hf"), "--output", str(ours), "--model-parallel-size", "2",
            "--pipe-parallel-size", "2", "--expert-parallel-size", "2"]  # fmt: skip
    assert convert_from_hf.main(argv) == 0
    step0 = ours / "global_step0"
    assert sorted(p.name for p in step0.glob("expert_states_*")) == [
        "expert_states_pp0_ep1.pt",
        "expert_states_pp1_ep1.pt",
    ]
    prompts, samples = tmp_path / "prompts.txt", tmp_path / "samples.jsonl"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    port = free_port()
    imported = json.loads((ours / "hf_import.yml").read_text())  # JSON is YAML
    assert imported["moe_expert_parallel_size"] == 2
    config = dict(
        imported,
        model_parallel_size=1,
        pipe_parallel_size=1,
        num_gpus=2,
        master_port=port,
        train_micro_batch_size_per_gpu=1,
        text_gen_type="input-file",
        sample_input_file=str(prompts),
        sample_output_file=str(samples),
        maximum_tokens=NEW,
        temperature=0.0,
    )
    try:
        deepy("generate.py", config, tmp_path)
    finally:  # DeepSpeed's CPU all-reduce leaves its shared-memory buffers behind on exit
        for leftover in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"):
            leftover.unlink(missing_ok=True)
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert [r["context"] for r in records] == PROMPTS
    eod = make_tokenizer("HFTokenizer", vocab_file=str(HF_TOKENIZER)).eod
    for record in records:
        prompt = record["prompt_tokens"]
        assert record["tokens"] == their_greedy_tokens(hf, prompt, eod), record["context"]
