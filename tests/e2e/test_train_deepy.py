"""Training through `deepy.py` on CPU ranks: SIGTERM mid-run saves a checkpoint and the resumed
run repeats the unbroken run's losses bit for bit (pipeline, 2 ranks); a 4-rank tensor ×
data-parallel ZeRO-2 run trains, evaluates, logs and keeps only the newest checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from megatron.checkpoint.folders import list_checkpoints, read_latest
from tests.distributed import free_port
from tests.tiny import tiny_settings, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300


def _write_config(folder: Path, **changes) -> Path:
    return write_config(folder, tiny_settings(folder, master_port=free_port(), **changes))


def _deepy(config: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "deepy.py", "train.py", str(config)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen) -> str:
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"deepy did not finish within {TIMEOUT} s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:]
    return out


def _records(folder: Path) -> list[dict]:
    path = folder / "logs" / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _train_losses(folder: Path) -> dict[int, float]:
    return {r["iteration"]: r["loss"] for r in _records(folder) if "split" not in r}


def _workers(proc: subprocess.Popen) -> list[psutil.Process]:
    """The train.py ranks (not the DeepSpeed runner and launcher above them)."""
    children = psutil.Process(proc.pid).children(recursive=True)
    return [p for p in children if "train.py" in p.cmdline()[1:3]]


def test_sigterm_saves_and_resumed_run_is_exact(tmp_path):
    layout = dict(pipe_parallel_size=2, num_gpus=2, train_iters=80, eval_interval=40)
    unbroken_dir, broken_dir = tmp_path / "unbroken", tmp_path / "broken"
    _finish(_deepy(_write_config(unbroken_dir, checkpoint_factor=None, **layout)))
    unbroken = _train_losses(unbroken_dir)
    assert sorted(unbroken) == list(range(1, 81))

    broken_config = _write_config(broken_dir, checkpoint_factor=None, **layout)
    proc = _deepy(broken_config)
    deadline = time.monotonic() + TIMEOUT
    while not any(it >= 3 for it in _train_losses(broken_dir)):
        assert proc.poll() is None and time.monotonic() < deadline, "run ended before step 3"
        time.sleep(0.02)
    for worker in _workers(proc):
        worker.send_signal(signal.SIGTERM)
    out = _finish(proc)
    tag = read_latest(broken_dir / "ckpt")
    assert tag is not None, out[-3000:]
    stopped_at = int(tag.removeprefix("global_step"))
    assert 3 <= stopped_at < 80  # saved where the signal stopped it, not at the end

    _finish(_deepy(broken_config))  # resume from `latest`
    broken = _train_losses(broken_dir)
    assert sorted(broken) == list(range(1, 81))
    assert broken == unbroken  # bitwise: JSON floats round-trip exactly


def test_four_ranks_tp2_dp2_zero2_keeps_last_checkpoint(tmp_path):
    folder = tmp_path / "tp2dp2"
    config = _write_config(
        folder,
        pipe_parallel_size=0,
        model_parallel_size=2,
        num_gpus=4,
        zero_optimization={"stage": 2},
        train_iters=12,
        checkpoint_factor=4,
        keep_last_n_checkpoints=1,
        eval_interval=6,
    )
    out = _finish(_deepy(config))
    assert "world 4 = data 2 × pipeline 1 (plain engine) × tensor 2; ZeRO stage 2" in out
    losses = _train_losses(folder)
    assert sorted(losses) == list(range(1, 13)) and losses[12] < losses[1] - 1.0
    evals = [r for r in _records(folder) if r.get("split") == "valid"]
    assert [r["iteration"] for r in evals] == [6, 12]
    assert [it for it, _ in list_checkpoints(folder / "ckpt")] == [12]
    assert read_latest(folder / "ckpt") == "global_step12"
