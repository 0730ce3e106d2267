"""One `deepy.py` run as a user starts it, with synthetic data, hybrid sharding and both
profilers on: 4 CPU ranks of ZeRO-3 with hpZ groups of 2 train on `data_impl: dummy` (no data
files), log and evaluate; every rank writes a profiler trace (valid JSON) holding exactly the
iterations [profile_step_start, profile_step_stop), and, on CPU, a memory trace with the
allocations of those iterations. (`tests/parallel/test_zero3_hpz.py` checks the hpZ groups and
losses themselves.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.e2e.test_train_deepy import _deepy, _finish, _records, _write_config

pytestmark = pytest.mark.slow


def _steps_in(trace: Path) -> set[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}


def test_dummy_data_run_writes_traces_of_the_chosen_steps(tmp_path):
    folder, memory = tmp_path / "run", tmp_path / "memory"
    config = _write_config(
        folder,
        num_gpus=4,
        pipe_parallel_size=0,
        zero_optimization={"stage": 3, "zero_hpz_partition_size": 2},
        gradient_accumulation_steps=1,
        data_impl="dummy",
        data_path=None,
        data_cache_path=None,
        save=None,
        load=None,
        checkpoint_factor=None,
        train_iters=6,
        profile=True,
        profile_step_start=3,
        profile_step_stop=5,
        memory_profiling=True,
        memory_profiling_path=str(memory),
    )
    out = _finish(_deepy(config))
    assert "ZeRO stage 3 (hpZ: parameters partitioned within groups of 2 ranks)" in out
    assert "(synthetic tokens: data_impl dummy)" in out
    train = [r for r in _records(folder) if "split" not in r]
    assert [r["iteration"] for r in train] == list(range(1, 7))
    assert all(math.isfinite(r["loss"]) for r in train)
    assert [r["iteration"] for r in _records(folder) if r.get("split") == "valid"] == [3, 6]

    profile = folder / "logs" / "profile"
    traces = sorted(p.name for p in profile.iterdir())
    assert traces == [f"rank{r}.iters3-4.pt.trace.json" for r in range(4)]
    for name in traces:
        assert _steps_in(profile / name) == {"ProfilerStep#3", "ProfilerStep#4"}

    memory_traces = sorted(memory.iterdir())
    assert [p.name for p in memory_traces] == [
        f"rank{r}.iters3-4.memory.pt.trace.json" for r in range(4)
    ]
    for path in memory_traces:
        events = json.loads(path.read_text())["traceEvents"]
        allocations = [e for e in events if e.get("name") == "[memory]"]
        assert allocations and all(e["args"]["Bytes"] != 0 for e in allocations)
        assert _steps_in(path) == {"ProfilerStep#3", "ProfilerStep#4"}
