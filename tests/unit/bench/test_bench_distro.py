"""`bench/bench_distro.py --tiny` trains AdamW and Distro on 2 gloo ranks and counts bytes.

The counter must see DeepSpeed's own gradient all-reduce (keyword arguments, inside the
engine): AdamW's all-reduced bytes per step are at least the fp32 gradients of the model.
Distro's engine does not all-reduce them, its exchange is an all-gather, and it sends over
an order of magnitude fewer bytes. Losses are finite; their values are not asserted.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import free_port
from tests.tiny import char_corpus

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow  # two tiny runs on 2 ranks


def test_tiny_run_measures_both_optimizers(tmp_path):
    out = tmp_path / "tiny.json"
    sets = [f"data_path={char_corpus()}", "tokenizer_type=CharLevelTokenizer",
            f"data_cache_path={tmp_path / 'cache'}", "split=90,8,2"]  # fmt: skip
    command = [sys.executable, "bench/bench_distro.py", "configs/small.yml", "--tiny",
               "--steps", "2", "--out", str(out), "--work", str(tmp_path)]  # fmt: skip
    command += [arg for s in sets for arg in ("--set", s)]
    env = {**os.environ, "MASTER_PORT": str(free_port()), "DS_ACCELERATOR": "cpu"}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    adamw, distro = result["rows"]["AdamW"], result["rows"]["Distro"]
    assert adamw["steps"] == distro["steps"] == 2
    assert adamw["bytes_per_step_by_collective"]["all_reduce"] >= 4 * adamw["parameters"]
    assert distro["bytes_per_step_by_collective"]["all_gather"] > 0
    assert distro["bytes_per_step_by_collective"].get("all_reduce", 0) < adamw["parameters"]
    assert result["bytes_ratio"] > 10
    for row in (adamw, distro):
        assert row["bytes_per_step"] == row["bytes_per_step_rank1"]
        assert math.isfinite(row["valid_loss"]) and math.isfinite(row["last_loss"])
