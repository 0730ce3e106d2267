"""Sequence-length curriculum through `pretrain` on two gloo ranks, pipeline-parallel (every
stage drops its activation buffers when the length changes): the run stopped at step 3 and
resumed repeats the unbroken run bit for bit, and each step trains on the scheduled length,
under the pipeline and the plain engine."""

from __future__ import annotations

import json

import pytest

from tests.distributed import run_distributed
from tests.parallel.test_train_zero_resume import _pretrain_all
from tests.tiny import tiny_settings

pytestmark = pytest.mark.slow

# GPT-NeoX's section; DeepSpeed's scheduler holds 32 from step 2 on (it stops at
# max_difficulty), so a resume that lost the scheduler's state would train on 16.
CURRICULUM = {
    "enabled": True,
    "curriculum_type": "seqlen",
    "min_difficulty": 8,
    "max_difficulty": 24,
    "schedule_type": "fixed_discrete",
    "schedule_config": {"difficulty": [8, 24, 16], "max_step": [1, 2]},
}


def test_a_resumed_curriculum_run_repeats_the_unbroken_one(tmp_path):
    layout = dict(pipe_parallel_size=2, curriculum_learning=CURRICULUM)
    runs = [
        tiny_settings(tmp_path / "unbroken", **layout),
        tiny_settings(tmp_path / "broken", exit_interval=3, **layout),
        tiny_settings(tmp_path / "broken", **layout),
        # the plain engine (data-parallel here) cuts its micro-batches the same way
        tiny_settings(tmp_path / "plain", **{**layout, "pipe_parallel_size": 0}, save=None),
    ]
    unbroken, stopped, resumed, plain = run_distributed(_pretrain_all, 2, runs)[0]
    assert stopped["losses"] == unbroken["losses"][:3]
    assert resumed["losses"] == unbroken["losses"][3:]  # bitwise
    assert resumed["valid"] == unbroken["valid"]
    assert len(plain["losses"]) == 6
    for run in ("unbroken", "plain"):
        lines = (tmp_path / run / "logs" / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        lengths = [r["curriculum_seqlen"] for r in records if "split" not in r]
        assert lengths == [8, 24, 24, 24, 24, 24], run
