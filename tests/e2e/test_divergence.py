"""A diverging run never passes for a healthy one, through `deepy.py` on CPU.

A healthy run saves checkpoints 2 and 4; it is resumed with an absurd learning rate (1e30):
step 5 (finite loss) blows the weights up to ~1e30, still finite, and every later forward pass
overflows. Steps 6 and 7 have a NaN loss and are skipped (weights untouched), and after
`max_consecutive_skipped_steps` (2) the run stops at iteration 7 with a non-zero exit and a
message naming it. Every checkpoint kept holds only finite tensors (the one saved at the
skipped step 6 is step 5's state), `latest` names a complete one, `keep_last_n_checkpoints`
(1) has kept it, and metrics.jsonl shows the NaN loss (not null). In fp32 and bf16, with the
pipeline engine and the plain engine. (Before: the NaN steps were applied, NaN checkpoints
saved up to iteration 12, the finite ones pruned, and the run exited 0 logging `null`.)
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.checkpoint.folders import COMPLETE, list_checkpoints, read_latest
from megatron.checkpoint.safe_load import load_file
from tests.distributed import free_port
from tests.tiny import tiny_settings, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300
VARIANTS = {
    "fp32_pipeline": dict(pipe_parallel_size=1),
    "fp32_plain": dict(pipe_parallel_size=0),
    # ZeRO 1: DeepSpeed 0.19.8 cannot resume its bf16 pipeline optimizer at ZeRO 0 (KeyError
    # in BF16_Optimizer._load_legacy_checkpoint), with or without this trainer's loading
    "bf16_pipeline_zero1": dict(
        pipe_parallel_size=1, precision="bfloat16", zero_optimization={"stage": 1}
    ),
    "bf16_plain": dict(pipe_parallel_size=0, precision="bfloat16"),
}


def _deepy(folder: Path, **changes) -> subprocess.CompletedProcess:
    settings = tiny_settings(
        folder, master_port=free_port(), keep_last_n_checkpoints=1, eval_interval=0,
        do_test=False, **changes,
    )  # fmt: skip
    config = write_config(folder, settings, name=f"run{len(list(folder.glob('run*.yml')))}.yml")
    return subprocess.run(
        [sys.executable, "deepy.py", "train.py", str(config)],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _finite_files(checkpoint: Path) -> list[str]:
    """Names of the checkpoint's .pt files holding a non-finite float tensor."""
    bad = []

    def walk(value, name):
        if torch.is_tensor(value) and value.is_floating_point():
            if not bool(torch.isfinite(value).all()):
                bad.append(name)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item, name)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item, name)

    for path in sorted(checkpoint.glob("*.pt")):
        walk(load_file(path), path.name)
    return bad


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_diverging_run_stops_and_keeps_the_last_finite_checkpoint(tmp_path, variant):
    folder = tmp_path / variant
    folder.mkdir()
    layout = VARIANTS[variant]
    healthy = _deepy(folder, train_iters=4, checkpoint_factor=2, **layout)
    assert healthy.returncode == 0, healthy.stdout[-3000:] + healthy.stderr[-3000:]
    assert read_latest(folder / "ckpt") == "global_step4"

    diverging = _deepy(
        folder, train_iters=12, checkpoint_factor=1, max_consecutive_skipped_steps=2,
        lr_decay_style="constant", warmup=0.0, override_lr_scheduler=True,
        optimizer={"type": "AdamW", "params": {"lr": 1.0e30, "betas": [0.9, 0.95]}},
        **layout,
    )  # fmt: skip
    out = diverging.stdout + diverging.stderr
    assert diverging.returncode != 0, out[-4000:]
    assert "stopping at iteration 7: the last 2 optimizer steps were all skipped" in out
    assert read_latest(folder / "ckpt") == "global_step6"
    assert [it for it, _ in list_checkpoints(folder / "ckpt")] == [6]
    assert (folder / "ckpt" / "global_step6" / COMPLETE).is_file()
    assert _finite_files(folder / "ckpt" / "global_step6") == []

    lines = (folder / "logs" / "metrics.jsonl").read_text().splitlines()
    records = {r["iteration"]: r for r in map(json.loads, lines) if "split" not in r}
    assert sorted(records) == [1, 2, 3, 4, 5, 6, 7]
    assert math.isfinite(records[5]["loss"]) and records[5]["skipped"] == 0
    for it in (6, 7):
        assert math.isnan(records[it]["loss"]) and records[it]["skipped"] == 1, records[it]
        assert not math.isfinite(records[it]["grad_norm"]), records[it]
    assert '"loss": NaN' in lines[-1]
