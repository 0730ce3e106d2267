"""Checkpoint schedule, atomic `latest`, pruning (complete folders only, failures reported),
RNG round trip, save/load around an engine, no save of a state holding inf/NaN."""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron.checkpoint.folders import (
    COMPLETE,
    list_checkpoints,
    prune_checkpoints,
    read_latest,
    write_latest,
)
from megatron.training.checkpoint.checkpoint_io import CheckpointIO, rng_state, set_rng_state
from megatron.training.checkpoint.disk_space import CheckpointSaveError
from megatron.training.checkpoint.policy import CheckpointPolicy, SaveSchedule
from megatron.training.loop.callbacks import CheckpointCallback


def test_linear_and_log_schedules():
    linear = SaveSchedule(5, "linear", extra_iters=[3], train_iters=12)
    assert [i for i in range(1, 13) if linear.should_save(i)] == [3, 5, 10, 12]
    log = SaveSchedule(2, "log", train_iters=40)
    assert [i for i in range(1, 41) if log.should_save(i)] == [1, 2, 4, 8, 16, 32, 40]
    assert [i for i in range(1, 30) if SaveSchedule(None).should_save(i)] == []
    with pytest.raises(ValueError, match="checkpoint_factor 1"):
        SaveSchedule(1, "log")


def test_from_config(make_config):
    cfg = make_config(checkpoint_factor=3, extra_save_iters=[4])
    schedule = SaveSchedule.from_config(cfg, train_iters=7)
    assert [i for i in range(1, 8) if schedule.should_save(i)] == [3, 4, 6, 7]


def _fake_checkpoints(root: Path, iterations, partial=()):
    for it in iterations:
        (root / f"global_step{it}").mkdir(parents=True)
        if it not in partial:
            (root / f"global_step{it}" / COMPLETE).write_text(f"global_step{it}")
    (root / "not_a_checkpoint").mkdir()


def test_latest_is_replaced_atomically(tmp_path):
    _fake_checkpoints(tmp_path, [10, 20])
    assert read_latest(tmp_path) is None
    write_latest(tmp_path, "global_step10")
    write_latest(tmp_path, "global_step20")
    assert read_latest(tmp_path) == "global_step20"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    (tmp_path / "latest").write_text("global_step30")
    with pytest.raises(FileNotFoundError, match="global_step30"):
        read_latest(tmp_path)


def test_prune_keeps_newest_and_latest(tmp_path):
    _fake_checkpoints(tmp_path, [5, 10, 15, 20, 25])
    write_latest(tmp_path, "global_step10")  # e.g. a run resumed from an older checkpoint
    deleted = prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in deleted) == ["global_step15", "global_step5"]
    assert [it for it, _ in list_checkpoints(tmp_path)] == [10, 20, 25]
    assert prune_checkpoints(tmp_path, keep=None) == []


def test_prune_never_deletes_a_pinned_folder(tmp_path):
    # a DPO/KTO run saving where it started: its reference model reloads global_step5 on resume
    _fake_checkpoints(tmp_path, [5, 10, 15])
    write_latest(tmp_path, "global_step15")
    deleted = prune_checkpoints(tmp_path, keep=1, pinned=[tmp_path / "global_step5"])
    assert [p.name for p in deleted] == ["global_step10"]
    assert [it for it, _ in list_checkpoints(tmp_path)] == [5, 15]


def test_partial_folders_never_count_toward_keep_last_n(tmp_path):
    # 12 and 30: crashes mid-save (no completion marker); latest is 20
    _fake_checkpoints(tmp_path, [5, 10, 12, 15, 20, 30], partial=(12, 30))
    write_latest(tmp_path, "global_step20")
    assert [it for it, _ in list_checkpoints(tmp_path, complete_only=True)] == [5, 10, 15, 20]
    deleted = prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in deleted) == ["global_step10", "global_step5"]
    # the partial 30 did not push the whole 15 out; partial folders are left alone
    assert [it for it, _ in list_checkpoints(tmp_path)] == [12, 15, 20, 30]


def test_a_failed_prune_is_reported(tmp_path, monkeypatch, caplog):
    _fake_checkpoints(tmp_path, [5, 10, 15])
    write_latest(tmp_path, "global_step15")
    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        if Path(path).name == "global_step5":
            raise PermissionError(13, "Permission denied", str(path))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    with caplog.at_level(logging.WARNING):
        deleted = prune_checkpoints(tmp_path, keep=1)
    assert [p.name for p in deleted] == ["global_step10"]
    assert "global_step5" in caplog.text and "Permission denied" in caplog.text


def test_rng_round_trip():
    state = rng_state()
    draws = (random.random(), np.random.rand(), torch.rand(2).tolist())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(2).tolist()) == draws


class FakeEngine:
    """Stands in for DeepSpeed's engine: writes one file per save."""

    def __init__(self, fail=False):
        self.fail = fail
        self.loaded = None
        self.optimizer = None  # no per-rank optimizer state (Distro's) to save

    def fp16_enabled(self):  # fp32: no loss scaler to restore after a load
        return False

    def save_checkpoint(self, save_dir, tag, save_latest=True, client_state=None):
        assert save_latest is False  # our `latest` is the one that counts
        self.client_state = client_state
        (Path(save_dir) / tag).mkdir(parents=True, exist_ok=True)
        if self.fail:
            raise OSError("disk full")
        (Path(save_dir) / tag / "mp_rank_00_model_states.pt").write_text("weights")

    def load_checkpoint(self, load_dir, tag, **kwargs):
        self.loaded = (tag, kwargs)
        return str(Path(load_dir) / tag), {}


def test_save_then_load_restores_trainer_state_and_rng(tmp_path):
    io = CheckpointIO(FakeEngine(), str(tmp_path), config_dict={"hidden_size": 64}, keep_last_n=2)
    for it in (2, 4, 6):
        io.save(it, {"consumed_samples": it * 8})
    assert read_latest(tmp_path) == "global_step6"
    assert [it for it, _ in list_checkpoints(tmp_path)] == [4, 6]
    assert (tmp_path / "global_step6" / "config.json").is_file()
    expected = torch.rand(3)  # the draw right after the last save
    torch.rand(5)
    engine = FakeEngine()
    io = CheckpointIO(engine, None)
    state = io.load(str(tmp_path))
    assert state["iteration"] == 6 and state["consumed_samples"] == 48
    io.restore_rng(state)
    assert torch.equal(torch.rand(3), expected)
    assert engine.loaded[1]["load_optimizer_states"] is True


def test_crash_mid_save_keeps_previous_latest(tmp_path):
    CheckpointIO(FakeEngine(), str(tmp_path)).save(2, {})
    assert (tmp_path / "global_step2" / COMPLETE).is_file()
    with pytest.raises(CheckpointSaveError, match="disk full"):
        CheckpointIO(FakeEngine(fail=True), str(tmp_path)).save(4, {})
    assert read_latest(tmp_path) == "global_step2"
    assert [it for it, _ in list_checkpoints(tmp_path, complete_only=True)] == [2]


def test_a_crash_while_saving_over_an_old_folder_leaves_it_partial(tmp_path):
    io = CheckpointIO(FakeEngine(), str(tmp_path))
    io.save(2, {})
    io.save(4, {})
    # e.g. a run resumed from 1 that reaches 2 again, and dies
    with pytest.raises(CheckpointSaveError):
        CheckpointIO(FakeEngine(fail=True), str(tmp_path)).save(2, {})
    assert not (tmp_path / "global_step2" / COMPLETE).exists()
    assert [it for it, _ in list_checkpoints(tmp_path, complete_only=True)] == [4]


class _Loop:
    def __init__(self, iteration, messages):
        self.state = type("State", (), {"iteration": iteration})()
        self.engine = None  # one process: no device for collectives
        self.loggers = type("Loggers", (), {"log_text": messages.append})()

    def trainer_state(self):
        return {"consumed_samples": 8 * self.state.iteration}


def test_a_state_holding_inf_or_nan_is_never_saved(tmp_path):
    finite = {"now": True}
    io = CheckpointIO(FakeEngine(), str(tmp_path), keep_last_n=1)
    policy = CheckpointPolicy(SaveSchedule(1))
    callback = CheckpointCallback(io, policy, True, is_finite=lambda: finite["now"])
    messages = []
    callback.after_step(_Loop(1, messages))
    finite["now"] = False
    callback.after_step(_Loop(2, messages))
    callback.on_end(_Loop(2, messages), stopped=True)
    assert read_latest(tmp_path) == "global_step1"
    assert [it for it, _ in list_checkpoints(tmp_path)] == [1]  # survived keep_last_n 1
    assert messages[0] == "saved checkpoint global_step1"
    assert messages[1].startswith("not saving checkpoint global_step2: the weights or")


def test_finetune_and_no_load_optim(tmp_path):
    CheckpointIO(FakeEngine(), str(tmp_path)).save(2, {"consumed_samples": 16})
    engine = FakeEngine()
    assert CheckpointIO(engine, None).load(str(tmp_path), finetune=True) is None
    assert engine.loaded[1]["load_module_only"] is True
    assert engine.loaded[1]["load_optimizer_states"] is False
    CheckpointIO(engine, None).load(str(tmp_path), load_optim=False)
    assert engine.loaded[1]["load_optimizer_states"] is False
    assert CheckpointIO(engine, None).load(str(tmp_path / "nothing")) is None
