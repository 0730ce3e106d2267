"""The checkpoint policy in `pretrain` on two gloo ranks: time-based temporary checkpoints
decided by rank 0's clock (rank 1's never says the interval has passed: only the broadcast
decision makes both ranks save together), the previous temporary folder gone once the next
checkpoint is complete, permanent tiers surviving keep_last_n_checkpoints, and a run that
crashes after a temporary checkpoint resuming from it bit for bit."""

from __future__ import annotations

import itertools
import os

import pytest

from megatron.checkpoint.folders import PERMANENT, read_latest
from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow


class Crash(Exception):
    """Stands for a node lost right after iteration `CRASH_AT`'s checkpoint."""


CRASH_AT = 7


def _crash_after_checkpoint(original):
    def after_step(self, loop):
        original(self, loop)
        if loop.state.iteration == CRASH_AT:
            raise Crash(f"lost after iteration {CRASH_AT}")

    return after_step


def _unbroken_crashed_resumed(rank, world_size, unbroken, policy_run):
    from megatron.training import pretrain
    from megatron.training.checkpoint import policy as checkpoint_policy
    from megatron.training.loop.callbacks import CheckpointCallback

    if rank == 0:  # ten minutes pass between any two looks at rank 0's clock
        ticks = itertools.count()
        checkpoint_policy.monotonic = lambda: 600.0 * next(ticks)
    losses = pretrain(resolve(unbroken, world_size)).losses
    original = CheckpointCallback.after_step
    CheckpointCallback.after_step = _crash_after_checkpoint(original)
    with pytest.raises(Crash):
        pretrain(resolve(policy_run, world_size))
    CheckpointCallback.after_step = original
    save = policy_run["save"]
    at_crash = sorted(os.listdir(save))
    resumed = pretrain(resolve(policy_run, world_size))
    return {"unbroken": losses, "at_crash": at_crash, "resumed": resumed.losses}


def test_temporary_and_permanent_checkpoints_and_resume(tmp_path):
    quick = dict(train_iters=9, eval_interval=0, do_test=False)
    unbroken = tiny_settings(tmp_path / "unbroken", save=None, load=None, **quick)
    policy_run = tiny_settings(
        tmp_path / "policy",
        checkpoint_keep=[{"every": 2, "until": 4}],
        checkpoint_factor=3,
        keep_last_n_checkpoints=1,
        checkpoint_save_interval_minutes=10,
        **quick,
    )
    result = run_distributed(_unbroken_crashed_resumed, 2, unbroken, policy_run)[0]
    # 1 temporary, 2 permanent, 3 step, 4 permanent, 5 temporary, 6 step (3 pruned, 5 retired),
    # 7 temporary, then the crash
    assert result["at_crash"] == [
        "global_step2",
        "global_step4",
        "global_step6",
        "global_step7_temporary",
        "latest",
    ]
    # resumed from the temporary 7: 8 temporary (7 retired), 9 step (6 pruned, 8 retired)
    assert result["resumed"] == result["unbroken"][CRASH_AT:]  # bitwise
    save = tmp_path / "policy" / "ckpt"
    assert sorted(p.name for p in save.iterdir() if p.is_dir()) == [
        "global_step2",
        "global_step4",
        "global_step9",
    ]
    assert read_latest(save) == "global_step9"
    assert (save / "global_step2" / PERMANENT).is_file()
    assert not (save / "global_step9" / PERMANENT).exists()
