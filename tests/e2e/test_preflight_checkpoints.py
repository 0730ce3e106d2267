"""`load` and `save` through `deepy.py`: pre-flight refusals exit 2 before any worker starts,
naming the checkpoint's keys, the file in the way and the space; a save that fails mid-run
stops the run (status 2, a message naming the folder and the space, alone: the disk is not a
bug, so no traceback; `tests/unit/test_errors.py` shows it with `--verbose`) with `latest` on
the last complete checkpoint, whose size on disk is what the pre-flight estimate said."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.checkpoint.folders import COMPLETE, read_latest
from megatron.checkpoint.size import checkpoint_size
from megatron.checkpoint_tools import ModelSchema, write_checkpoint
from megatron.model import ModelArgs
from tests.distributed import free_port
from tests.tiny import resolve, tiny_settings, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# What a checkpoint holds beyond the estimate: trainer state, RNG states, config.json and the
# archive headers (tens of kB), against 1.6 MB of tensors for this model.
TOLERANCE = 0.10


def deepy(folder: Path, **changes) -> subprocess.CompletedProcess:
    settings = tiny_settings(folder, master_port=free_port(), num_gpus=1, **changes)
    config = write_config(folder, settings)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "deepy.py", "train.py", str(config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def no_worker_started(proc: subprocess.CompletedProcess, folder: Path) -> bool:
    return "launching" not in proc.stderr and not (folder / "logs").exists()


def test_wrong_model_and_no_room_are_refused_before_launch(tmp_path):
    old = tmp_path / "old"
    saved = resolve(tiny_settings(tmp_path), world_size=1)
    schema = ModelSchema(ModelArgs.from_config(saved))
    folder = write_checkpoint(
        old,
        schema=schema,
        state={name: torch.zeros(spec.shape) for name, spec in schema.params.items()},
        tp=1,
        pp=1,
        iteration=3,
        config_dict=saved.to_dict(),
    )
    # 2 layers 65536 wide: about 10^11 parameters, 1.6 PB per checkpoint with Adam
    proc = deepy(tmp_path, load=str(old), hidden_size=65536, save=str(tmp_path / "new"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "pre-flight found 2 problem(s)" in proc.stderr
    # a training run's load folder of another model: the run's own folder comes first
    assert f"load: {old} holds a run of another model" in proc.stderr
    assert f"({folder}: hidden_size 64, the config says 65536;" in proc.stderr
    assert f"free under '{tmp_path / 'new'}'" in proc.stderr
    assert "not even one checkpoint fits" in proc.stderr
    assert no_worker_started(proc, tmp_path)


def test_a_file_in_the_way_of_save_is_refused_before_launch(tmp_path):
    (tmp_path / "ckpt").write_text("not a folder")
    proc = deepy(tmp_path, save=str(tmp_path / "ckpt"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"save: save folder '{tmp_path / 'ckpt'}' is a file, not a folder" in proc.stderr
    assert no_worker_started(proc, tmp_path)


def test_a_save_that_fails_stops_the_run_and_latest_stays(tmp_path):
    save = tmp_path / "ckpt"
    save.mkdir()
    (save / "global_step2").write_text("a file where the step-2 checkpoint would go")
    changes = dict(train_iters=2, checkpoint_factor=1, eval_interval=100)
    proc = deepy(tmp_path, **changes)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    message = f"deepy.py: error on rank 0: could not save checkpoint {save / 'global_step2'}"
    assert out.count(message) == 1, out[-3000:]
    assert f"free under {save}" in out and "one checkpoint needs" in out
    assert "Traceback" not in out and "tracebacks:" not in out, out[-3000:]
    assert read_latest(save) == "global_step1"
    assert (save / "global_step1" / COMPLETE).is_file()
    estimate = checkpoint_size(resolve(tiny_settings(tmp_path, **changes), world_size=1)).total
    actual = sum(f.stat().st_size for f in (save / "global_step1").iterdir())
    assert estimate <= actual <= estimate * (1 + TOLERANCE), (estimate, actual)
