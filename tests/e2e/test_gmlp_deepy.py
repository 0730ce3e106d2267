"""GPT-NeoX's gmlp_small.yml trains through `deepy.py` as a user runs it, at CPU size: the file
unchanged, a second file with the run's paths and tokenizer, and `--set` for the sizes."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.distributed import free_port
from tests.e2e.test_train_deepy import TIMEOUT, _records
from tests.tiny import tiny_settings, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
GMLP_SMALL = REPO / "tests" / "data" / "configs" / "gmlp_small-neox.yml"
CPU_SIZE = [
    "num_layers=2",
    "hidden_size=32",
    "num_attention_heads=2",
    "seq_length=32",
    "max_position_embeddings=32",
    "attention_config=[[['gmlp', 'amlp'], 'all']]",  # aMLP's tiny attention too
    "gmlp_attn_dim=8",
    "train_micro_batch_size_per_gpu=2",
    "train_iters=4",
    "lr_decay_iters=4",
    "eval_interval=2",
    "eval_iters=1",
    "log_interval=1",
    "checkpoint_factor=4",
    "fp16.enabled=false",  # CPU ranks: fp32
    "distributed_backend=gloo",
    # The file's `eps: 1.0e_8` is a string to YAML (GPT-NeoX's loader reads it so too), which
    # Adam refuses on the workers: the number it means.
    "optimizer.params.eps=1.0e-8",
]


def test_gpt_neox_gmlp_small_trains_through_deepy(tmp_path):
    neox_keys = set(yaml.safe_load(GMLP_SMALL.read_text()))
    run = tiny_settings(tmp_path, master_port=free_port())
    machine = write_config(tmp_path, {k: v for k, v in run.items() if k not in neox_keys})
    sets = [word for item in CPU_SIZE for word in ("--set", item)]
    proc = subprocess.run(
        [sys.executable, "deepy.py", "train.py", str(GMLP_SMALL), str(machine), *sets],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    train = [r for r in _records(tmp_path) if "split" not in r]
    assert [r["iteration"] for r in train] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in train)
    assert [r["iteration"] for r in _records(tmp_path) if r.get("split") == "valid"] == [2, 4]
