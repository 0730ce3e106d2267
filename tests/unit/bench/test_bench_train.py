"""`bench/bench_train.py --out FILE` writes its JSON to FILE (as the other benchmarks'
`--out`), with the figures of a tiny run. Runs as a subprocess (it initialises
torch.distributed); timings themselves are never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import free_port
from tests.tiny import char_corpus

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow  # one tiny engine and the plain loop on one rank


def test_out_is_the_file_written(tmp_path):
    out = tmp_path / "nested" / "train.json"
    sets = [f"data_path={char_corpus()}", "tokenizer_type=CharLevelTokenizer",
            f"data_cache_path={tmp_path / 'cache'}", "split=90,8,2",
            "num_layers=2", "attention_config=[[['global'], 'all']]", "hidden_size=64",
            "num_attention_heads=4", "seq_length=32", "max_position_embeddings=32",
            "train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=1"]  # fmt: skip
    command = [sys.executable, "bench/bench_train.py", "configs/small.yml", "--steps", "1",
               "--warmup", "0", "--engines", "plain", "--precisions", "fp32",
               "--loss-chunk-tokens", "0,16", "--out", str(out)]  # fmt: skip
    command += [arg for s in sets for arg in ("--set", s)]
    env = {**os.environ, "MASTER_PORT": str(free_port()), "DS_ACCELERATOR": "cpu"}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"wrote {out}" in run.stdout
    result = json.loads(out.read_text())
    assert result["tokens_per_step"] == 2 * 32 and result["steps"] == 1
    assert [(r["precision"], r["contender"]) for r in result["rows"]] == [
        ("fp32", "ours, plain engine"),
        ("fp32", "ours, plain engine, loss_chunk_tokens 0"),
        ("fp32", "ours, plain engine, loss_chunk_tokens 16"),
        ("fp32", "plain PyTorch loop, HF GPTNeoXForCausalLM"),
    ]


def test_memory_bench_measures_each_contender_in_its_own_process(tmp_path):
    out = tmp_path / "memory.json"
    sets = [f"data_path={char_corpus()}", "tokenizer_type=CharLevelTokenizer",
            f"data_cache_path={tmp_path / 'cache'}", "split=90,8,2",
            "num_layers=2", "attention_config=[[['global'], 'all']]", "hidden_size=64",
            "num_attention_heads=4", "seq_length=32", "max_position_embeddings=32",
            "train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=1"]  # fmt: skip
    command = [sys.executable, "bench/bench_train_memory.py", "configs/small.yml", "--steps",
               "1", "--precisions", "fp32", "--loss-chunk-tokens", "0,16",
               "--out", str(out)]  # fmt: skip
    command += [arg for s in sets for arg in ("--set", s)]
    env = {**os.environ, "MASTER_PORT": str(free_port()), "DS_ACCELERATOR": "cpu"}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["contender"] for r in runs] == [
        "fp32:pipeline:config", "fp32:plain:config", "fp32:pipeline:0", "fp32:plain:0",
        "fp32:pipeline:16", "fp32:plain:16", "fp32:loop:config",
    ]  # fmt: skip
    assert all(r["peak"] >= r["after_build"] > 0 for r in runs)
