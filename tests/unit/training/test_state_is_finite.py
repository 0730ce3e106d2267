"""`state_is_finite` (asked before every checkpoint save) reads one value per call, copies no
tensor element-wise into bools, and still finds an inf, a -inf or a NaN in any weight, fp32
master partition or optimizer-state tensor.

A model, an AdamW over flat fp32 "partitions" (as DeepSpeed's bf16/ZeRO optimizers hold) with
its state, one process; the reference is `torch.isfinite` over every tensor.
"""

from __future__ import annotations

import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.training.step.nonfinite import state_is_finite
from tests.device_costs import HostReads

BAD = (float("inf"), float("-inf"), float("nan"))


class LargestBool(TorchDispatchMode):
    """The most elements of any bool tensor an op makes while active."""

    numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if torch.is_tensor(t) and t.dtype == torch.bool:
                self.numel = max(self.numel, t.numel())
        return out


def _trained():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)).bfloat16()
    flat = torch.nn.Parameter(
        torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    )
    optimizer = torch.optim.AdamW([flat, torch.nn.Parameter(torch.zeros(0))], lr=1e-3)
    flat.grad = torch.randn_like(flat)
    optimizer.step()
    engine = types.SimpleNamespace(module=model, device=torch.device("cpu"))
    return engine, optimizer


def _places(engine, optimizer):
    """Every tensor `state_is_finite` must look at: weights, master partition, state."""
    (flat, _), state = optimizer.param_groups[0]["params"], optimizer.state
    return [*engine.module.parameters(), flat, state[flat]["exp_avg"], state[flat]["exp_avg_sq"]]


def test_finite_state_is_one_read_and_no_element_wise_bool_copy():
    engine, optimizer = _trained()
    counters = [s["step"] for s in optimizer.state.values()]  # host tensors on any device
    with HostReads(exempt=counters) as reads, LargestBool() as bools:
        assert state_is_finite(engine, optimizer)
    assert reads.count == 1, reads.report()
    # two per tensor looked at (8 here), not a copy of one: before, one of each (the partition:
    # 340, the smallest matrix 64)
    assert bools.numel <= 16


@pytest.mark.parametrize("bad", BAD)
def test_a_non_finite_value_anywhere_is_found(bad):
    engine, optimizer = _trained()
    for i in range(len(_places(engine, optimizer))):
        engine, optimizer = _trained()
        place = _places(engine, optimizer)[i]
        with torch.no_grad():
            place.view(-1)[place.numel() // 2] = bad
        reference = all(bool(torch.isfinite(t).all()) for t in _places(engine, optimizer))
        assert not reference and not state_is_finite(engine, optimizer), (bad, i)
