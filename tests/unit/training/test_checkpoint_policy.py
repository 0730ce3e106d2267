"""Checkpoint policy (`megatron/training/checkpoint/policy.py`): Levanter's permanent tiers and
time-based temporary checkpoints beside GPT-NeoX's schedule, with a fake clock: which iterations
save which kind, which folders survive, where a resume starts, and the config checks."""

from __future__ import annotations

import logging

import pytest

from megatron.checkpoint.folders import (
    COMPLETE,
    PERMANENT,
    prune_checkpoints,
    read_latest,
    resume_tag,
    write_latest,
)
from megatron.config.groups.checkpointing import parse_checkpoint_keep
from megatron.config.schema import ConfigError
from megatron.training.checkpoint.checkpoint_io import CheckpointIO
from megatron.training.checkpoint.policy import CheckpointPolicy, SaveSchedule, retire_temporaries
from megatron.training.loop.callbacks import CheckpointCallback
from tests.unit.training.test_checkpointing import FakeEngine, _Loop


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_levanter_guide_tiers():
    # Levanter's guide: "every 1,000 steps until 10,000 steps, then every 5,000 steps until
    # 40,000 steps, then every 10,000 steps" (`until` inclusive, as its checkpointer reads it)
    tiers = parse_checkpoint_keep(
        [{"every": 1000, "until": 10000}, {"every": 5000, "until": 40000}, {"every": 10000}]
    )
    policy = CheckpointPolicy(SaveSchedule(None), tiers)
    expected = list(range(1000, 10001, 1000)) + list(range(15000, 40001, 5000))
    expected += list(range(50000, 100001, 10000))
    assert [i for i in range(1, 100001) if policy.is_permanent(i)] == expected


def test_a_tier_step_that_is_also_a_factor_step_is_saved_once_as_permanent():
    tiers = parse_checkpoint_keep([{"every": 4, "until": 8}])
    policy = CheckpointPolicy(SaveSchedule(6, train_iters=20), tiers)
    kinds = {i: policy.decide(i) for i in range(1, 21)}
    assert {i: k for i, k in kinds.items() if k} == {
        4: "permanent",
        6: "step",
        8: "permanent",
        12: "step",  # 12 is a multiple of 4, but the tier ended at 8
        18: "step",
        20: "step",  # the last iteration
    }


def _folders(root):
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def test_which_iterations_save_and_which_folders_survive(tmp_path):
    """One minute per iteration, a temporary checkpoint after 1.5 minutes without a save,
    permanent every 5 up to 10, extra_save_iters [7], keep_last_n_checkpoints 1, 16 iterations."""
    clock = FakeClock()
    tiers = parse_checkpoint_keep([{"every": 5, "until": 10}])
    policy = CheckpointPolicy(
        SaveSchedule(None, extra_iters=[7], train_iters=16), tiers, 1.5, clock
    )
    io = CheckpointIO(FakeEngine(), str(tmp_path), keep_last_n=1)
    callback = CheckpointCallback(io, policy, True)
    messages, after = [], {}
    for iteration in range(1, 17):
        clock.now += 60.0
        callback.after_step(_Loop(iteration, messages))
        after[iteration] = _folders(tmp_path)
    assert messages == [
        "saved checkpoint global_step2_temporary",  # 2 minutes since the start
        "saved checkpoint global_step4_temporary",  # 2 minutes since the last save
        "saved checkpoint global_step5 (permanent)",
        "saved checkpoint global_step7",  # extra_save_iters
        "saved checkpoint global_step9_temporary",
        "saved checkpoint global_step10 (permanent)",  # until is inclusive
        "saved checkpoint global_step12_temporary",
        "saved checkpoint global_step14_temporary",  # 15: the tier has ended
        "saved checkpoint global_step16",  # the last iteration
    ]
    # the previous temporary folder goes once the next checkpoint of any kind is complete
    assert after[3] == ["global_step2_temporary"]
    assert after[4] == ["global_step4_temporary"]
    assert after[5] == ["global_step5"]
    assert after[9] == ["global_step5", "global_step7", "global_step9_temporary"]
    # keep_last_n_checkpoints 1 counts only the step schedule's folders: 7 goes at 16, the
    # permanent 5 and 10 stay
    assert after[15] == ["global_step10", "global_step14_temporary", "global_step5", "global_step7"]
    assert after[16] == ["global_step10", "global_step16", "global_step5"]
    assert (tmp_path / "global_step10" / PERMANENT).is_file()
    assert read_latest(tmp_path) == "global_step16"


def test_the_previous_temporary_stays_until_the_next_save_is_complete(tmp_path):
    clock = FakeClock()
    policy = CheckpointPolicy(SaveSchedule(3), (), 1.0, clock)
    callback = CheckpointCallback(CheckpointIO(FakeEngine(), str(tmp_path)), policy, True)
    clock.now = 60.0
    callback.after_step(_Loop(1, []))
    callback.io = CheckpointIO(FakeEngine(fail=True), str(tmp_path))  # the disk fills up
    clock.now = 90.0
    with pytest.raises(Exception, match="disk full"):  # the save's error, whatever its class
        callback.after_step(_Loop(3, []))
    assert read_latest(tmp_path) == "global_step1_temporary"
    assert (tmp_path / "global_step1_temporary" / COMPLETE).is_file()


def test_the_interval_counts_from_the_last_save_of_any_kind():
    clock = FakeClock()
    policy = CheckpointPolicy(SaveSchedule(4), (), 3.0, clock)
    clock.now = 150.0
    assert policy.decide(3) is None  # 2.5 minutes since the start
    clock.now = 200.0
    assert policy.decide(4) == "step"
    policy.saved()
    clock.now = 300.0
    assert policy.decide(5) is None  # 100 s after the step checkpoint, not 300 s
    clock.now = 380.0
    assert policy.decide(6) == "temporary"
    assert CheckpointPolicy(SaveSchedule(None), (), None, clock).decide(7) is None


def test_keep_last_n_never_deletes_permanent_or_temporary_folders(tmp_path):
    for name in ("global_step2", "global_step4", "global_step6", "global_step8_temporary"):
        (tmp_path / name).mkdir()
        (tmp_path / name / COMPLETE).write_text(name)
    (tmp_path / "global_step2" / PERMANENT).write_text("global_step2")
    write_latest(tmp_path, "global_step8_temporary")
    deleted = prune_checkpoints(tmp_path, keep=1)
    assert [p.name for p in deleted] == ["global_step4"]
    assert _folders(tmp_path) == ["global_step2", "global_step6", "global_step8_temporary"]
    assert retire_temporaries(tmp_path, "global_step8_temporary") == []


def _complete(root, *names, partial=()):
    for name in names:
        (root / name).mkdir()
        if name not in partial:
            (root / name / COMPLETE).write_text(name)


def test_resume_takes_latest_else_the_newest_complete_of_either_kind(tmp_path, caplog):
    _complete(
        tmp_path,
        "global_step5",
        "global_step8_temporary",
        "global_step10",
        partial=["global_step10"],
    )
    write_latest(tmp_path, "global_step8_temporary")
    assert resume_tag(tmp_path) == "global_step8_temporary"
    write_latest(tmp_path, "global_step10")  # e.g. copied without its marker
    with caplog.at_level(logging.WARNING, logger="megatron.checkpoint.folders"):
        assert resume_tag(tmp_path) == "global_step8_temporary"
        assert "global_step10', which is partial" in caplog.text
        write_latest(tmp_path, "global_step12")
        assert resume_tag(tmp_path) == "global_step8_temporary"
        assert "global_step12', which is missing" in caplog.text
    assert resume_tag(tmp_path / "nothing") is None


def test_resume_trusts_latest_where_no_folder_has_a_marker(tmp_path):
    # a checkpoint written by GPT-NeoX: `latest` and global_step folders, no markers
    (tmp_path / "global_step3").mkdir()
    write_latest(tmp_path, "global_step3")
    assert resume_tag(tmp_path) == "global_step3"
    write_latest(tmp_path, "global_step4")
    with pytest.raises(FileNotFoundError, match="global_step4"):
        resume_tag(tmp_path)


def test_load_resumes_a_temporary_checkpoint(tmp_path):
    clock = FakeClock()
    policy = CheckpointPolicy(SaveSchedule(None), (), 1.0, clock)
    callback = CheckpointCallback(CheckpointIO(FakeEngine(), str(tmp_path)), policy, True)
    clock.now = 61.0
    callback.after_step(_Loop(3, []))
    engine = FakeEngine()
    state = CheckpointIO(engine, None).load(str(tmp_path))
    assert state["iteration"] == 3 and state["consumed_samples"] == 24
    assert engine.loaded[0] == "global_step3_temporary"


@pytest.mark.parametrize(
    "keep, message",
    [
        ([{"every": 0}], "checkpoint_keep\\[0\\].*every 0 is not valid"),
        ([{"every": 5}, {"every": 10}], "only the last tier may omit 'until'"),
        ([{"every": 5, "until": 20}, {"every": 10, "until": 20}], "ascending order"),
        ([{"every": 5, "untill": 20}], "expected a mapping with 'every'"),
        ([{"every": 5, "until": 1.5}], "until 1.5 is not valid"),
    ],
)
def test_bad_checkpoint_keep_is_refused(make_config, keep, message):
    with pytest.raises(ConfigError, match=message):
        make_config(save="ckpt", checkpoint_keep=keep)


def test_interval_and_tiers_need_save_and_a_positive_interval(make_config):
    with pytest.raises(ConfigError, match="must be > 0"):
        make_config(save="ckpt", checkpoint_save_interval_minutes=0)
    with pytest.raises(
        ConfigError, match=r"checkpoint_keep .* would save checkpoints, but `save` is not set"
    ):
        make_config(checkpoint_keep=[{"every": 100}])
    cfg = make_config(
        save="ckpt", checkpoint_keep=[{"every": 10}], checkpoint_save_interval_minutes=0.5
    )
    policy = CheckpointPolicy.from_config(cfg, train_iters=200, clock=FakeClock())
    assert policy.interval == 30.0 and policy.decide(20) == "permanent"


def test_a_stop_saves_a_step_checkpoint_once(tmp_path):
    clock = FakeClock()
    policy = CheckpointPolicy(SaveSchedule(None), (), 1.0, clock)
    callback = CheckpointCallback(CheckpointIO(FakeEngine(), str(tmp_path)), policy, True)
    messages = []
    clock.now = 30.0
    callback.after_step(_Loop(1, messages))
    callback.on_end(_Loop(1, messages), stopped=True)  # exit_interval or a signal
    clock.now = 100.0
    callback.after_step(_Loop(2, messages))
    callback.on_end(_Loop(2, messages), stopped=True)  # already saved at this iteration
    assert messages == ["saved checkpoint global_step1", "saved checkpoint global_step2_temporary"]
    assert _folders(tmp_path) == ["global_step1", "global_step2_temporary"]
