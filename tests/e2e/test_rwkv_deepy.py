"""GPT-NeoX's own `configs/rwkv/170M.yml` trains through `deepy.py` on one CPU rank, unchanged
but for CPU-sized `--set` overrides (width, depth, length, fp32, the iterations) and a second
file with what it leaves to the user (data, tokenizer, where to write): a few steps of its
RWKV-6 layers with the pipeline engine, ZeRO-1, activation checkpointing and partitioning on,
and the loss goes down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import free_port
from tests.tiny import char_corpus, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NEOX_RWKV = REPO / "tests" / "data" / "configs" / "rwkv-170m-neox.yml"
CPU_SIZED = [
    "num_layers=2",
    "attention_config=[[[rwkv], 2]]",
    "hidden_size=64",
    "num_attention_heads=2",
    "seq_length=32",
    "max_position_embeddings=32",
    "train_micro_batch_size_per_gpu=4",
    "train_iters=8",
    "lr_decay_iters=8",
    "bf16.enabled=false",
    "bf16.bf16=false",
    "log_interval=1",
    "eval_interval=1000",
    "eval_iters=1",
    "checkpoint_factor=1000",
    "distributed_backend=gloo",
    "num_workers=0",
]


def test_gpt_neox_rwkv_config_trains(tmp_path):
    local = {
        "data_path": char_corpus(),
        "data_cache_path": str(tmp_path / "index_cache"),
        "tokenizer_type": "CharLevelTokenizer",
        "log_dir": str(tmp_path / "logs"),
        "master_port": free_port(),
        "include": "localhost:0",
    }
    local_file = write_config(tmp_path, local, name="local.yml")
    command = [sys.executable, "deepy.py", "train.py", str(NEOX_RWKV), str(local_file)]
    run = subprocess.run(
        [*command, *(arg for item in CPU_SIZED for arg in ("--set", item))],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    losses = [r["loss"] for r in map(json.loads, lines) if "loss" in r and r.get("split") is None]
    assert len(losses) == 8
    assert losses[-1] < losses[0] - 0.5, losses
