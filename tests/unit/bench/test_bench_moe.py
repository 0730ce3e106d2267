"""`bench/bench_moe.py --tiny` trains a MoE toy and its dense twin and reports sane figures.

Runs as a subprocess (it initialises torch.distributed). The dense twin's active parameters
differ from the MoE model's by the routers and the extra output biases only (counted here
from the shapes, independently of `counting.py`); the per-expert counts of every MoE layer,
read from the router by the benchmark's hook, sum to the tokens it saw times top_k (the toy
is dropless). Timings themselves are never asserted.
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
pytestmark = pytest.mark.slow  # two tiny engines on one rank


def test_tiny_run_reports_both_models(tmp_path):
    out = tmp_path / "tiny.json"
    sets = [f"data_path={char_corpus()}", "tokenizer_type=CharLevelTokenizer",
            f"data_cache_path={tmp_path / 'cache'}", "split=90,8,2"]  # fmt: skip
    command = [sys.executable, "bench/bench_moe.py", "configs/moe-small.yml", "--tiny",
               "--steps", "2", "--warmup", "1", "--out", str(out)]  # fmt: skip
    command += [arg for s in sets for arg in ("--set", s)]
    env = {**os.environ, "MASTER_PORT": str(free_port()), "DS_ACCELERATOR": "cpu"}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "MoE / dense tokens/s" in run.stdout
    result = json.loads(out.read_text())
    moe, dense = result["rows"]
    assert moe["contender"] == "MoE" and dense["contender"].startswith("dense")
    # Tiny: h 64, 2 layers, layer 0 with 4 experts top-2 of ffn 256, layer 1 dense.
    h, ffn, k, experts = 64, 256, 2, 4
    assert dense["moe_num_experts"] == 1 and dense["intermediate_size"] == (ffn + k * ffn) // 2
    assert (moe["mlp_width"], dense["mlp_width"]) == (ffn, dense["intermediate_size"])
    assert len(result["load_average_1_5_15_min"]["after"]) == 3  # the machine is shared
    router, extra_out_bias = experts * h, (k - 1) * h
    assert moe["active_parameters"] - dense["active_parameters"] == router + extra_out_bias
    assert dense["active_parameters"] == dense["total_parameters"] == dense["built_parameters"]
    assert moe["built_parameters"] == moe["total_parameters"]
    expert_params = 2 * h * ffn + ffn + h
    assert moe["total_parameters"] - moe["active_parameters"] == (experts - k) * expert_params
    tokens = result["tokens_per_step"] * (result["warmup"] + result["steps"])
    assert result["tokens_routed"] == tokens and not result["counts_before_dropping"]
    (counts,) = moe["expert_token_counts"]  # one MoE layer
    assert len(counts) == experts and sum(counts) == tokens * k
    assert dense["expert_token_counts"] == []
    for r in (moe, dense):
        assert r["seconds"] > 0 and r["tokens_per_sec"] > 0
        assert math.isfinite(r["first_loss"]) and math.isfinite(r["last_loss"])
    ratio = moe["tokens_per_sec"] / dense["tokens_per_sec"]
    assert abs(result["moe_over_dense_tokens_per_sec"] - ratio) <= 1e-12
    assert len(moe["step_seconds"]) == len(dense["step_seconds"]) == result["steps"] == 2
    pairs = sorted(d / m for m, d in zip(moe["step_seconds"], dense["step_seconds"]))
    assert abs(result["moe_over_dense_median_of_step_pairs"] - sum(pairs) / 2) <= 1e-12
