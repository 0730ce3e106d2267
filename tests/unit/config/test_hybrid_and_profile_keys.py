"""Config checks of hybrid sharding (`zero_optimization.zero_hpz_partition_size`) and of the
profiler keys: what cannot work is refused at resolution, naming the key, the file and what
would be valid; what works reaches the DeepSpeed config unchanged."""

from __future__ import annotations

import pytest

from megatron.config import ConfigError, deepspeed_config, load_config
from tests.unit.config.conftest import MINIMAL

PLAIN = "pipe_parallel_size: 0\n"


def _load(write, text, world_size=4):
    return load_config([write("run.yml", MINIMAL + text)], world_size=world_size, warn=[])


def test_hpz_reaches_deepspeed_with_zero3(write):
    cfg = _load(write, PLAIN + "zero_optimization: {stage: 3, zero_hpz_partition_size: 2}\n")
    assert deepspeed_config(cfg)["zero_optimization"]["zero_hpz_partition_size"] == 2


@pytest.mark.parametrize(
    "text, world_size, message",
    [
        (PLAIN + "zero_optimization: {stage: 2, zero_hpz_partition_size: 2}\n", 4, "stage is 2"),
        (
            "pipe_parallel_size: 1\nzero_optimization: {stage: 3, zero_hpz_partition_size: 2}\n",
            4,
            "pipe_parallel_size: 0",
        ),
        (PLAIN + "zero_optimization: {stage: 3, zero_hpz_partition_size: 4}\n", 6, "divide"),
        (PLAIN + "zero_optimization: {stage: 3, zero_hpz_partition_size: 8}\n", 4, "divide"),
        (
            PLAIN
            + "model_parallel_size: 2\nzero_optimization: {stage: 3, zero_hpz_partition_size: 2}\n",
            4,
            "tensor-parallel",
        ),
        (PLAIN + "zero_optimization: {stage: 3, zero_hpz_partition_size: two}\n", 4, "whole"),
    ],
)
def test_hpz_that_cannot_work_is_refused(write, text, world_size, message):
    with pytest.raises(ConfigError, match=f"zero_hpz_partition_size.*run.yml.*{message}"):
        _load(write, text, world_size)


@pytest.mark.parametrize(
    "text, key",
    [
        ("profile: true\nlog_dir: /tmp/x\nprofile_step_start: 5\nprofile_step_stop: 5\n", "stop"),
        ("profile: true\nlog_dir: /tmp/x\nprofile_step_start: 0\n", "profile_step_start"),
        ("profile: true\n", "log_dir"),
        ("memory_profiling: true\n", "memory_profiling_path"),
    ],
)
def test_profiling_that_cannot_work_is_refused(write, text, key):
    with pytest.raises(ConfigError, match=f"run.yml.*{key}|{key}.*run.yml"):
        _load(write, text, 1)


def test_profile_keys_are_gpt_neox_keys_that_take_effect(write):
    warn: list[str] = []
    text = MINIMAL + "profile: true\nlog_dir: /tmp/x\nmemory_profiling: true\n"
    text += "memory_profiling_path: /tmp/m\n"
    cfg = load_config([write("run.yml", text)], warn=warn)
    assert not [w for w in warn if "profil" in w]  # no "has no effect" warning any more
    lg = cfg.logging
    assert (lg.profile, lg.profile_step_start, lg.profile_step_stop) == (True, 10, 12)
    assert lg.memory_profiling and lg.memory_profiling_path == "/tmp/m"
