"""Training methods through `deepy.py train.py` as a user runs them, each on one CPU rank of the
tiny run (`tests/tiny.py`):

- the sequence-length curriculum (GPT-NeoX's `curriculum_learning` section): each logged
  iteration's `curriculum_seqlen` is DeepSpeed's `fixed_linear` schedule, written out here from
  DeepSpeed's `curriculum_scheduler.py`, and the tokens the run counts are that length times
  the samples of a step;
- Comet (`use_comet`) offline: the archive Comet writes holds the experiment's name and, per
  iteration, the training losses the run wrote to its metrics file;
- muP: `save_base_shapes` writes mup's base shapes (as the `mup` package computes them for
  the same models) and stops before training; a muP run reads them and trains, at the base
  width and at a wider one, whose saved optimizer scales the LR of its weight matrices down
  by the width multiplier.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from tests.distributed import free_port
from tests.e2e.test_train_deepy import REPO, _finish, _records, _train_losses
from tests.tiny import resolve, tiny_settings, write_config

pytestmark = pytest.mark.slow


def _run(folder: Path, env: dict | None = None, **changes) -> str:
    """Train the tiny run with `changes` on one CPU rank through `deepy.py`; its output."""
    settings = tiny_settings(folder, master_port=free_port(), num_gpus=1, **changes)
    proc = subprocess.Popen(
        [sys.executable, "deepy.py", "train.py", str(write_config(folder, settings))],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return _finish(proc)


def _fixed_linear(step: int, low: int, high: int, total: int, quantum: int) -> int:
    """DeepSpeed's `fixed_linear` difficulty at its global step `step` (counted from 1): the
    linear ramp from `low` to `high` over `total` steps, floored to a multiple of `quantum`,
    at least the first multiple of `quantum` from `low`, at most `high`."""
    length = math.floor(step / total * (high - low) + low)
    length -= length % quantum
    return min(max(length, -(-low // quantum) * quantum), high)


def test_sequence_length_curriculum_follows_deepspeeds_fixed_linear(tmp_path):
    low, high, total, quantum = 8, 32, 6, 8
    section = {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": low,
        "max_difficulty": high,
        "schedule_type": "fixed_linear",
        "schedule_config": {"total_curriculum_step": total, "difficulty_step": quantum},
    }
    out = _run(tmp_path, curriculum_learning=section, train_iters=8, eval_interval=8)
    train = [r for r in _records(tmp_path) if "split" not in r]
    assert [r["iteration"] for r in train] == list(range(1, 9)), out[-3000:]
    # Iteration k is the k-th step, DeepSpeed's global step k (GPT-NeoX asks the scheduler
    # with its completed iterations + 1): lengths 8, 16, 16, 24, 24, 32, 32, 32.
    lengths = [_fixed_linear(k, low, high, total, quantum) for k in range(1, 9)]
    assert [r["curriculum_seqlen"] for r in train] == lengths
    assert len(set(lengths)) == 4  # the schedule really moved through several lengths
    samples = 2 * 2 * 1  # micro batch × gradient accumulation × data parallel
    # A record's tokens/s is its interval's tokens over its seconds, and the intervals (one
    # step each) follow one another from the start of training: tokens = rate × interval.
    elapsed = [0.0] + [r["elapsed_s"] for r in train]
    tokens = [r["tokens_per_sec"] * (b - a) for r, a, b in zip(train, elapsed, elapsed[1:])]
    assert tokens == pytest.approx([samples * n for n in lengths], rel=1e-6)
    summary = re.search(r"tokens: ([\d,]+) in", out)
    assert summary is not None, out[-3000:]
    assert int(summary.group(1).replace(",", "")) == samples * sum(lengths)


def test_comet_offline_archive_holds_the_runs_losses(tmp_path):
    comet = tmp_path / "comet"
    env = {
        "COMET_START_ONLINE": "false",  # comet_ml's offline mode: an archive, no network
        "COMET_OFFLINE_DIRECTORY": str(comet),
        "COMET_ERROR_TRACKING_ENABLE": "false",
    }
    out = _run(
        tmp_path,
        env=env,
        use_comet=True,
        comet_project="methods",
        comet_experiment_name="tiny-through-deepy",
        train_iters=4,
        eval_interval=4,
    )
    losses = _train_losses(tmp_path)
    assert sorted(losses) == [1, 2, 3, 4], out[-3000:]
    archives = list(comet.glob("*.zip"))
    assert len(archives) == 1, out[-3000:]
    with zipfile.ZipFile(archives[0]) as z:
        messages = [json.loads(line) for line in z.read("messages.json").splitlines()]
        experiment = json.loads(z.read("experiment.json"))
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    comet_losses = {
        m["step"]: float(m["metricValue"]) for m in metrics if m["metricName"] == "train/loss"
    }
    assert comet_losses == pytest.approx(losses, rel=1e-12)
    valid = [m["step"] for m in metrics if m["metricName"] == "valid/loss"]
    assert valid == [4]
    others = {
        m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"
    }
    assert others["Name"] == "tiny-through-deepy"
    assert experiment["project_name"] == "methods"


def _mup_reference_shapes(settings: dict, path: Path) -> dict:
    """mup's own base shapes (`mup.make_base_shapes`) of the run's model against one twice as
    wide (hidden size and head width doubled, as GPT-NeoX's save_base_shapes widens it)."""
    mup = pytest.importorskip("mup")
    from megatron.model.args import ModelArgs
    from megatron.model.gpt import build_gpt

    args = ModelArgs.from_config(resolve({**settings, "pipe_parallel_size": 0}, world_size=1))
    wide = dataclasses.replace(args, hidden_size=2 * args.hidden_size, head_dim=2 * args.head_dim)
    mup.make_base_shapes(build_gpt(args), build_gpt(wide), savefile=str(path))
    return yaml.safe_load(path.read_text())


def test_mup_base_shapes_then_training_at_base_and_wider_width(tmp_path):
    pytest.importorskip("mup")
    shapes = tmp_path / "base-shapes.yml"
    mup_keys = dict(use_mup=True, base_shapes_file=str(shapes))

    base = tmp_path / "base"
    out = _run(base, save_base_shapes=True, **mup_keys)
    assert shapes.is_file(), out[-3000:]
    assert not (base / "ckpt").exists() and _records(base) == []  # no training
    settings = tiny_settings(base)  # the model the file was written for
    theirs = _mup_reference_shapes(settings, tmp_path / "mup-reference.yml")
    assert yaml.safe_load(shapes.read_text()) == theirs

    for name, width in (("same", 64), ("wider", 128)):
        folder = tmp_path / name
        out = _run(folder, hidden_size=width, **mup_keys)
        losses = _train_losses(folder)
        assert sorted(losses) == list(range(1, 7)), out[-3000:]
        assert losses[6] < losses[1] - 0.5, (name, losses)
        # The optimizer DeepSpeed saved trains the matrix-like weights at the LR / the width
        # multiplier (MuAdam's rule): one LR at the base width, LR and LR / 2 at twice it.
        saved = folder / "ckpt" / "global_step6" / "mp_rank_00_model_states.pt"
        groups = torch.load(saved, weights_only=False)["optimizer"]["param_groups"]
        rates = {g["lr"] for g in groups}
        assert max(rates) / min(rates) == pytest.approx(width / 64), (name, groups)


def test_an_80_layer_mup_run_gets_its_config_through_a_file(tmp_path):
    """muP's base shapes at 80 layers make the bundle too long for the command line: the
    launch passes it in a file in `.megatron_launch/` (`deepy.py::bundle_args`), the worker
    trains from it, and the file is gone when the run ends."""
    pytest.importorskip("mup")
    shapes = tmp_path / "base-shapes.yml"
    keys = dict(use_mup=True, base_shapes_file=str(shapes), num_layers=80, train_iters=2)
    _run(tmp_path / "base", save_base_shapes=True, **keys)
    assert len(yaml.safe_load(shapes.read_text())) > 80 * 4
    folder = tmp_path / "run"
    out = _run(folder, eval_interval=2, save=None, load=None, **keys)
    assert sorted(_train_losses(folder)) == [1, 2], out[-3000:]
    assert not list((REPO / ".megatron_launch").glob("config-*"))
