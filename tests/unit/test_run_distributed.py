"""The suite's `run_distributed` (tests/distributed.py): ranks forked from a preloaded server
that still see the caller's environment, and a failing rank that fails the call."""

from __future__ import annotations

import os
import sys

import pytest

from tests.distributed import PRELOAD, run_distributed


def _what_the_rank_sees(rank, world_size, name):
    return {
        "value": os.environ.get(name),
        "rank": os.environ["RANK"],
        "preloaded": [m for m in PRELOAD if m in sys.modules],
    }


def test_ranks_start_with_the_trainer_imported_and_the_callers_environment(monkeypatch):
    run_distributed(_what_the_rank_sees, 1, "UNSET_HERE")  # the server exists from here on
    monkeypatch.setenv("RUN_DISTRIBUTED_PROBE", "set after the server started")
    seen = run_distributed(_what_the_rank_sees, 2, "RUN_DISTRIBUTED_PROBE")
    assert [s["rank"] for s in seen] == ["0", "1"]
    assert all(s["value"] == "set after the server started" for s in seen)
    # This module imports neither DeepSpeed nor the trainer: a spawned rank would not have them.
    assert all(s["preloaded"] == PRELOAD for s in seen)


def _fail_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 was told to fail")
    return rank


def test_a_failing_rank_fails_the_call_with_its_traceback():
    with pytest.raises(AssertionError, match="rank 1 failed:(.|\n)*rank 1 was told to fail"):
        run_distributed(_fail_on_rank_1, 2)
