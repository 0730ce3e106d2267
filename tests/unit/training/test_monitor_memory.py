"""On a GPU each training record carries the allocator's peak (`max_memory_allocated_gib`),
read from torch's own count, which waits for nothing on the device; on a CPU it is absent."""

from __future__ import annotations

import torch

from megatron.training.metrics.monitor import TrainMonitor


def test_records_carry_the_gpu_allocators_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monitor = TrainMonitor(8, 1.0, world_size=1, peak_tflops=None, train_iters=6)
    assert monitor.record(1, 0.1, None, None)["max_memory_allocated_gib"] == 3.0


def test_records_on_a_cpu_have_no_memory_figure(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monitor = TrainMonitor(8, 1.0, world_size=1, peak_tflops=None, train_iters=6)
    assert "max_memory_allocated_gib" not in monitor.record(1, 0.1, None, None)
