"""The CUDA RNG state of a checkpoint loads where a process sees fewer GPUs than at save.

CUDA is faked: `torch.cuda.random`'s per-device generators become a list as long as the
visible device count, and indexing past it raises IndexError as torch's
`default_generators[idx]` does (SLURM's `--gpus-per-task=1` leaves one visible device).
"""

from __future__ import annotations

import pytest
import torch

from megatron.training.checkpoint import checkpoint_io
from megatron.training.checkpoint.checkpoint_io import rng_state, set_rng_state
from megatron.training.checkpoint.neox_files import client_state


def _state(seed: int, offset: int) -> torch.Tensor:
    """A Philox state as CUDA's generator keeps it: seed and offset, 8 bytes each."""
    return torch.tensor([seed, offset], dtype=torch.int64).view(torch.uint8)


class FakeCuda:
    """`count` visible devices, each with a generator state; `current` is the set device."""

    def __init__(self, count: int, current: int = 0):
        self.states = [_state(0, 0) for _ in range(count)]
        self.current = current

    def _index(self, device) -> int:
        if isinstance(device, int):
            return device
        index = torch.device(device).index
        return self.current if index is None else index

    def get_rng_state(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state, device="cuda"):
        self.states[self._index(device)] = state.clone()  # IndexError past the count

    def get_rng_state_all(self):
        return [s.clone() for s in self.states]


@pytest.fixture
def fake_cuda(monkeypatch):
    def install(count: int, current: int = 0) -> FakeCuda:
        fake = FakeCuda(count, current)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: fake.current)
        for module in (torch.cuda, torch.cuda.random):
            monkeypatch.setattr(module, "get_rng_state", fake.get_rng_state)
            monkeypatch.setattr(module, "set_rng_state", fake.set_rng_state)
            monkeypatch.setattr(module, "get_rng_state_all", fake.get_rng_state_all)
        return fake

    return install


def _saved_with_eight(drawn_device: int) -> dict:
    """A checkpoint's state as the old code wrote it from a process that saw 8 GPUs and drew
    on `drawn_device` only: the others keep the state `torch.manual_seed(1234)` gave them."""
    states = [_state(1234, 0) for _ in range(8)]
    states[drawn_device] = _state(1234, 4096)
    return {**rng_state(), "cuda": states}


def test_old_checkpoint_of_eight_gpus_loads_on_one(fake_cuda, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")  # as pin_device leaves it for local rank 3
    monkeypatch.setenv("MEGATRON_NODE_LOCAL_RANK", "3")
    fake = fake_cuda(count=1)
    set_rng_state(_saved_with_eight(drawn_device=3))
    assert torch.equal(fake.states[0], _state(1234, 4096))


def test_old_checkpoint_without_draws_takes_the_local_ranks_entry(fake_cuda, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "5")
    fake = fake_cuda(count=8, current=5)
    states = [_state(1234 + i, 0) for i in range(2)]  # two devices: no entry stands out
    set_rng_state({**rng_state(), "cuda": states})
    assert torch.equal(fake.states[5], states[5 % 2])


def test_saved_state_is_the_own_devices_and_round_trips(fake_cuda):
    fake = fake_cuda(count=4, current=2)
    fake.states[2] = _state(7, 64)
    state = rng_state()
    assert torch.equal(state["cuda"], _state(7, 64))
    assert torch.equal(client_state(None, 1, state)["cuda_rng_state"], _state(7, 64))
    fake.states[2] = _state(7, 128)
    set_rng_state(state)
    assert torch.equal(fake.states[2], _state(7, 64))
    assert all(torch.equal(fake.states[i], _state(0, 0)) for i in (0, 1, 3))


def test_own_state_is_the_odd_entry_out():
    entries = [_state(9, 0)] * 3 + [_state(9, 32)]
    assert torch.equal(checkpoint_io._own_cuda_state(entries), _state(9, 32))
