"""The time-based checkpoint policy rides on the step's one all-reduce and read.

Two gloo ranks run the non-finite step check with a `StopRequest` that carries the policy:
rank 0's clock says the interval has passed, rank 1's never does, and both decide to save a
temporary checkpoint after the step with the check's one read and no broadcast of their own.
An answer carried at an iteration that saves for another reason is not reused by the next.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from megatron.training.checkpoint.policy import CheckpointPolicy, SaveSchedule
from tests.device_costs import HostReads
from tests.distributed import run_distributed
from tests.unit.training.test_checkpoint_policy import FakeClock


def _one_step(rank, world_size):
    from megatron.training.loop.signals import StopRequest
    from megatron.training.step.nonfinite import NonFiniteSteps

    clock = FakeClock()
    policy = CheckpointPolicy(SaveSchedule(None), (), 1.0, clock)
    clock.now = 90.0 if rank == 0 else 0.0  # only rank 0's clock has passed the minute
    stop = StopRequest()
    stop.ride(policy)
    engine = SimpleNamespace(device=torch.device("cpu"), optimizer=None)
    check = NonFiniteSteps(engine, object(), None, lambda: torch.tensor(2.5), stop)
    with HostReads() as reads:
        bad = check._bad_anywhere()
        kind = policy.decide(5)
        stopping = stop.agreed()
    with HostReads() as alone:
        next_kind = policy.decide(6)  # nothing carried: the broadcast of rank 0's view
    return bad, kind, stopping, reads.count, reads.report(), next_kind, alone.count


def test_both_ranks_take_rank_0s_decision_with_the_steps_one_read():
    for bad, kind, stopping, count, report, next_kind, alone in run_distributed(_one_step, 2):
        assert (bad, kind, stopping) == (False, "temporary", False)
        assert count == 1, report  # the check's tolist; no broadcast
        assert next_kind == "temporary" and alone == 1  # without the check: a read of its own


def test_a_carried_answer_is_not_reused_by_a_later_iteration():
    clock = FakeClock()
    policy = CheckpointPolicy(SaveSchedule(2), (), 1.0, clock)
    clock.now = 90.0
    policy.carried(True)
    assert policy.decide(2) == "step"
    policy.saved()
    assert policy.decide(3) is None  # 0 s since the step checkpoint, whatever was carried
