"""GPU-only training checks: fused AdamW, and fp16 dynamic loss scaling in DeepSpeed's real
engine (an overflowing step is skipped, the scale halves, the run trains on; too many
overflows in a row stop the run with an explanation)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed import free_port
from tests.tiny import tiny_settings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
REPO = Path(__file__).resolve().parents[3]


def test_adam_uses_the_fused_kernel_on_cuda():
    from megatron.model.param_groups import param_groups
    from megatron.training.optim.optimizers import build_optimizer

    model = torch.nn.Linear(4, 4).cuda()
    opt = build_optimizer(param_groups(model, 0.1), "AdamW", 1e-3, 0.1)
    assert opt.defaults["fused"] is True


def _deepy(folder: Path, **changes) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "run.yml"
    settings = tiny_settings(folder, master_port=free_port(), num_gpus=1, **changes)
    settings["distributed_backend"] = "nccl"
    config.write_text(json.dumps(settings))
    return subprocess.run(
        [sys.executable, "deepy.py", "train.py", str(config)],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _train_records(folder: Path) -> list[dict]:
    lines = (folder / "logs" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "split" not in r]


FP16 = {"loss_scale": 0, "initial_scale_power": 32, "loss_scale_window": 4, "hysteresis": 1,
        "min_loss_scale": 1}  # fmt: skip


def test_fp16_overflow_is_skipped_and_the_scale_backs_off(tmp_path):
    # 2**32 overflows fp16 gradients at once: the first steps are skipped, the scale halves
    # each time until the gradients fit, then training proceeds.
    done = _deepy(tmp_path / "fp16", fp16=FP16, train_iters=30, eval_interval=0, save=None)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = _train_records(tmp_path / "fp16")
    scales = [r["loss_scale"] for r in records]
    assert sum(r["skipped"] for r in records) >= 1
    assert scales[-1] < 2**32 and all(s is not None for s in scales)
    applied = [r["loss"] for r in records if not r["skipped"]]
    assert applied[-1] < applied[0]


def test_fp16_too_many_consecutive_overflows_stop_the_run(tmp_path):
    done = _deepy(tmp_path / "stop", fp16=FP16, max_consecutive_skipped_steps=2,
                  train_iters=30, eval_interval=0, save=None)  # fmt: skip
    assert done.returncode != 0
    assert re.search(
        r"stopping at iteration \d+: the last 2 optimizer steps were all skipped",
        done.stdout + done.stderr,
    )


def test_fp16_scale_follows_hysteresis_window_and_floor_on_the_gpu_engine(tmp_path):
    # A real run on the GPU's fp16 engine: the logged scale after every step is DeepSpeed's
    # (GPT-NeoX's) rule fed with the steps the run skipped (test_fp16_engine_scaling.py).
    from tests.unit.training.test_fp16_engine_scaling import ReferenceScaler

    fp16 = {"loss_scale": 0, "initial_scale_power": 32, "loss_scale_window": 3, "hysteresis": 2,
            "min_loss_scale": 1}  # fmt: skip
    done = _deepy(tmp_path / "hysteresis", fp16=fp16, train_iters=40, eval_interval=0,
                  save=None)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = _train_records(tmp_path / "hysteresis")
    reference = ReferenceScaler(2.0**32, window=3, hysteresis=2, min_scale=1)
    expected = [reference.update(bool(r["skipped"])) for r in records]
    assert [r["loss_scale"] for r in records] == expected
    assert records[0]["skipped"] and records[0]["loss_scale"] == 2.0**32  # absorbed, not halved
    assert not records[-1]["skipped"]
