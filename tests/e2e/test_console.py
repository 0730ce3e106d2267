"""What a person sees, through `deepy.py` on CPU ranks: a quiet console by default (our report,
a line after the first step saying when the next comes, one line per log interval with ETA and
TFLOP/s per rank, evaluations, checkpoints, a final summary; no DeepSpeed INFO lines or prints,
not even with `steps_per_print: 1` and `wall_clock_breakdown` (whose timings reach
metrics.jsonl), no warning that it guessed the device, no config bundle), also for a bf16 run
and its resume (DeepSpeed's bf16 optimizer prints its memory use as it is built, its loader
`_load_legacy_checkpoint`), which leave a start record each in the metrics.jsonl they share,
and for GPT-NeoX's `distributed_backend: nccl` on a machine without a GPU; everything with
`--verbose`; a free rendezvous port when the config sets none (while another run holds 29500);
and refusals before any worker starts: a missing optional package (with the pip command) and a
`master_port` that is taken."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.config.bundle import BUNDLE_FLAG
from tests.tiny import tiny_settings, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300
MARKER_WORKER = "import pathlib, sys\npathlib.Path(sys.argv[0]).with_suffix('.ran').touch()\n"


def run_config(folder: Path, **changes) -> Path:
    """A tiny 4-iteration run (no master_port unless given) writing under `folder`."""
    run = dict(train_iters=4, eval_interval=2, checkpoint_factor=4)
    return write_config(folder, tiny_settings(folder, **{**run, **changes}))


def deepy(script: str | Path, config: Path, *flags: str, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "deepy.py", str(script), str(config), *flags],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.fixture
def default_port_taken():
    """Hold 29500 (DeepSpeed's and GPT-NeoX's default) as a first run on this machine would."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("", 29500))
        sock.listen()
    except OSError:
        pass  # someone else holds it already: the same situation
    yield
    sock.close()


BF16 = dict(precision="bfloat16", zero_optimization={"stage": 1}, distributed_backend="nccl")
# What DeepSpeed prints or logs that the default console does not show: its prints while
# the engine is built and a checkpoint loaded, the device its import in deepy.py guessed, its
# progress line every `steps_per_print` steps (beside ours, with another loss) and its
# `wall_clock_breakdown` timers.
DEEPSPEED_PRINTS = ("SEED_LAYERS", "built successfully", "Max_MA", "CPU Virtual Memory",
                    "bf16_optimizer", "_load_legacy_checkpoint",
                    "Setting accelerator to CPU", "iter time (s)", "time (ms)")  # fmt: skip
# DeepSpeed's progress and timers at every step, if it printed them at all
CHATTY = dict(steps_per_print=1, wall_clock_breakdown=True)


def test_default_console_is_quiet_and_ends_with_a_summary(tmp_path, default_port_taken):
    folder = tmp_path / "run"
    proc = deepy("train.py", run_config(folder, log_interval=2, **BF16, **CHATTY))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "[INFO]" not in out and BUNDLE_FLAG not in out
    assert not [p for p in DEEPSPEED_PRINTS if p in out], out[-4000:]
    assert "nccl needs CUDA" not in out and "; backend " in out  # the one in use, once
    assert "start-up report" in out
    intervals = [line for line in out.splitlines() if line.startswith("iteration ")]
    assert [line.split(" | ")[0] for line in intervals] == ["iteration 2/4", "iteration 4/4"]
    first = out.index("first step done in ")  # between the report and the first interval
    assert out.index("start-up report") < first < out.index(intervals[0])
    assert "(iteration 1 of 4); the next line comes at iteration 2, in about " in out[first:]
    assert all(" | ETA " in line for line in intervals)
    assert all(" TFLOP/s/rank | " in line for line in intervals)  # CPU ranks, not GPUs
    assert "valid at iteration 2 | loss" in out and "saved checkpoint global_step4" in out
    summary = out[out.index("run summary") :]
    assert "finished at iteration 4 of 4" in summary and "final loss: train " in summary
    assert "tokens: 512 in " in summary  # 4 steps × global batch 4 × 32 tokens
    assert f"checkpoint: {folder / 'ckpt' / 'global_step4'}" in summary
    assert f"logs: {folder / 'logs' / 'metrics.jsonl'}" in summary
    records = [json.loads(line) for line in (folder / "logs" / "metrics.jsonl").open()]
    timed = [r for r in records if "split" not in r]  # wall_clock_breakdown's, as it was spent
    assert all(r["time/fwd"] > 0 and r["time/train_batch"] > 0 for r in timed), timed
    start = records[0]  # the run's start, first
    assert (start["split"], start["iteration"], start["train_iters"]) == ("run", 0, 4), start
    assert start["resumed_from"] is None
    assert start["config_files"] == [str(folder / "run.yml")] and start["run_id"], start
    port = int(out.split("master port ")[1].split()[0])
    assert port != 29500  # picked free, so it did not collide with the run holding 29500
    config = run_config(folder, train_iters=5, use_checkpoint_lr_scheduler=True, **BF16)
    resumed = deepy("train.py", config)  # loads the bf16 optimizer's state
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0 and "starting at 4" in out, out[-4000:]
    assert not [p for p in DEEPSPEED_PRINTS if p in out], out[-4000:]
    records = [json.loads(line) for line in (folder / "logs" / "metrics.jsonl").open()]
    starts = [(i, r) for i, r in enumerate(records) if r.get("split") == "run"]
    assert [r["iteration"] for _, r in starts] == [0, 4]  # appended to, where it resumed
    assert starts[1][1]["resumed_from"] == str(folder / "ckpt" / "global_step4")
    assert starts[1][0] > starts[0][0] and starts[1][1]["run_id"] != start["run_id"]
    trained = [r["iteration"] for r in records if "split" not in r]
    assert trained == [2, 4, 5]  # what readers that take records without a split read


def test_verbose_shows_deepspeed_and_the_worker_command(tmp_path):
    overlap = {**BF16, "zero_optimization": {"stage": 1, "overlap_comm": True}}
    config = run_config(tmp_path / "run", train_iters=1, **overlap, **CHATTY)
    proc = deepy("train.py", config, "--verbose")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "[INFO] [runner.py" in out and "[INFO] [launch.py" in out
    assert BUNDLE_FLAG in out and "SEED_LAYERS" in out and "Max_MA" in out
    assert "steps: 1 loss: " in out  # DeepSpeed's progress line, at steps_per_print
    assert "[Rank 0] time (ms) | batch_input: " in out  # its wall_clock_breakdown timers
    assert "zero_optimization.overlap_comm: off; DeepSpeed's pipeline engine" in out
    assert "DeepSpeedEngine configuration" in out  # the engine's INFO lines on the worker
    assert "run summary" in out


@pytest.fixture
def marker_worker(tmp_path):
    """A worker script named train.py that only leaves a file behind if it is ever started."""
    script = tmp_path / "worker" / "train.py"
    script.parent.mkdir()
    script.write_text(MARKER_WORKER)
    return script


def test_missing_optional_package_is_refused_before_launch(tmp_path, marker_worker):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['tensorboard'] = None\n")
    config = run_config(tmp_path / "run", tensorboard_dir=str(tmp_path / "tb"))
    env = {"PYTHONPATH": os.pathsep.join([str(shim), str(REPO)])}
    proc = deepy(marker_worker, config, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pip install 'tensorboard>=2.15'" in proc.stderr
    assert f"tensorboard_dir: {tmp_path / 'tb'}" in proc.stderr
    assert not marker_worker.with_suffix(".ran").exists() and "launching" not in proc.stderr


def test_taken_master_port_is_refused_before_launch(tmp_path, marker_worker):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        config = run_config(tmp_path / "run", master_port=port)
        proc = deepy(marker_worker, config)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"master_port: {port} (set in {config}) is already in use" in proc.stderr
    assert not marker_worker.with_suffix(".ran").exists()
