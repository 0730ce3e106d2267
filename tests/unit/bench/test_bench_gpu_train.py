"""`bench/bench_gpu_train.py --tiny` runs every contender end to end and writes sane figures.

The benchmark is meant for a GPU; here its logic runs on the CPU with a 2-layer toy (as a
subprocess: it initialises torch.distributed): every contender appears in the JSON, measured
or skipped with a reason (fp16 where DeepSpeed's accelerator has no fp16), with positive
tokens/s, TFLOP/s consistent with the model FLOPs of `megatron/training/metrics/flops.py`, and
MFU against the peak given on the command line. Timings themselves are never asserted.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from deepspeed.accelerator import get_accelerator

from megatron.config import config_from_dict
from megatron.training.metrics.flops import shape_from_config, training_flops_per_token
from tests.distributed import free_port

REPO = Path(__file__).resolve().parents[3]
CONTENDERS = (
    "ours {p}, eager",
    "ours {p}, torch_compile",
    "ours fp16, loss scaling",
    "plain loop, HF GPTNeoX {p}, eager",
    "plain loop, HF GPTNeoX {p}, torch.compile",
)
pytestmark = pytest.mark.slow  # compiles two models: about 90 s on 2 cores, cold

PEAK = 2.0  # TFLOP/s, an arbitrary peak so that MFU is computed on a CPU


def test_tiny_run_reports_every_contender(tmp_path):
    out = tmp_path / "tiny.json"
    command = [sys.executable, "bench/bench_gpu_train.py", "--tiny", "--steps", "2",
               "--warmup", "1", "--peak-tflops", str(PEAK), "--out", str(out),
               "--profile"]  # fmt: skip
    env = {**os.environ, "MASTER_PORT": str(free_port()), "DS_ACCELERATOR": "cpu"}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    mixed = "bf16" if torch.cuda.is_available() else "fp32"
    assert result["mixed_precision"] == mixed
    (section,) = result["shapes"]
    rows = {r["contender"]: r for r in section["rows"]}
    skipped = {s["contender"]: s["reason"] for s in section["skipped"]}
    expected = {name.format(p=mixed) for name in CONTENDERS}
    assert set(rows) | set(skipped) == expected and not set(rows) & set(skipped)
    # fp16 runs where DeepSpeed's accelerator has it (CUDA; a CPU with AVX512-FP16, Sapphire
    # Rapids' AMX); elsewhere it is skipped with the reason
    if not get_accelerator().is_fp16_supported():
        assert "ours fp16, loss scaling" in skipped and "fp16" in skipped["ours fp16, loss scaling"]
    else:
        assert "ours fp16, loss scaling" in rows
    # FLOPs: the honest count of the tiny model, as flops.py gives it for the same config.
    cfg = config_from_dict(
        dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64,
             max_position_embeddings=64, pos_emb="rotary", rotary_pct=0.25,
             gpt_j_residual=True, no_weight_tying=True, train_micro_batch_size_per_gpu=2),
        vocab_size=512, world_size=1,
    )  # fmt: skip
    flops = training_flops_per_token(shape_from_config(cfg))
    assert section["model_flops_per_token"] == flops
    tokens = 2 * section["tokens_per_step"]
    for name, row in rows.items():
        assert row["seconds"] > 0 and row["tokens_per_sec"] > 0, name
        assert abs(row["tokens_per_sec"] * row["seconds"] - tokens) <= 1e-6 * tokens, name
        assert abs(row["tflops"] - row["tokens_per_sec"] * flops / 1e12) <= 1e-9, name
        assert 0 < row["mfu"] and abs(row["mfu"] - row["tflops"] / PEAK) <= 1e-12, name
        assert (row["peak_memory_gib"] is None) != torch.cuda.is_available(), name
        profile = row["profile"]  # one more step under torch.profiler
        assert profile["wall_ms"] > 0 and "error" not in profile, name
        assert (profile["device_busy_ms"] > 0) == torch.cuda.is_available(), name
        assert sum(profile["by_kind_ms"].values()) == pytest.approx(profile["device_busy_ms"])
    assert section["ours_best"] in rows and section["ours_best"].startswith("ours")
    tables = out.with_name("tiny_profile.txt").read_text()
    assert all(f": {name}\n" in tables for name in rows)  # the profiler's table of each


def test_contenders_filter_runs_only_those_named(tmp_path):
    out = tmp_path / "tiny.json"
    command = [sys.executable, "bench/bench_gpu_train.py", "--tiny", "--steps", "1",
               "--warmup", "1", "--contenders", "hf-eager", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "MASTER_PORT": str(free_port()), "DS_ACCELERATOR": "cpu"}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    (section,) = json.loads(out.read_text())["shapes"]
    mixed = "bf16" if torch.cuda.is_available() else "fp32"
    assert [r["contender"] for r in section["rows"]] == [CONTENDERS[3].format(p=mixed)]
    assert section["ours_best"] is None and not section["skipped"]
    bad = subprocess.run([*command[:-4], "--contenders", "ours-eagre"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "ours-eagre" in bad.stderr and "hf-compile" in bad.stderr


def test_host_syncs_are_counted_by_the_line_that_caused_them(monkeypatch):
    """The GPU count (`torch.cuda.set_sync_debug_mode("warn")`: one warning per sync) with the
    debug mode stubbed, as a CPU build has none: syncs by line, other warnings left out."""
    import warnings

    sys.path.insert(0, str(REPO / "bench"))
    import bench_gpu_train

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)

    def step():
        for _ in range(2):
            warnings.warn("called a synchronizing CUDA operation", stacklevel=1)  # counted here
        warnings.warn("something else", stacklevel=1)

    where = collections.Counter()
    assert bench_gpu_train.host_syncs(step, where) == 2
    ((place, count),) = where.items()
    assert place.startswith("test_bench_gpu_train.py:") and count == 2
