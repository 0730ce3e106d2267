"""Samplers and loaders: per-rank slices, resume from consumed samples, batch size changes."""

from __future__ import annotations

import numpy as np
import pytest

from megatron.data.data_loaders import build_data_iterator
from megatron.data.samplers import PretrainingSampler


def _global_steps(total, consumed, mbs, dp, grad_acc, steps):
    """Indices each rank reads over `steps` optimizer steps: {rank: [micro-batches]}."""
    out = {}
    for rank in range(dp):
        it = iter(PretrainingSampler(total, consumed, mbs, rank, dp))
        out[rank] = [next(it) for _ in range(steps * grad_acc)]
    return out


def test_each_rank_gets_its_slice_of_every_global_batch():
    batches = _global_steps(total=64, consumed=0, mbs=2, dp=3, grad_acc=2, steps=2)
    assert batches[0][:2] == [[0, 1], [6, 7]]
    assert batches[1][:2] == [[2, 3], [8, 9]]
    assert batches[2][:2] == [[4, 5], [10, 11]]
    everything = sorted(i for b in batches.values() for mb in b for i in mb)
    assert everything == list(range(24))  # 2 steps x global batch 12, nothing twice


def test_resume_sees_exactly_the_remaining_samples():
    full = _global_steps(total=200, consumed=0, mbs=2, dp=2, grad_acc=2, steps=6)
    first = _global_steps(total=200, consumed=0, mbs=2, dp=2, grad_acc=2, steps=3)
    rest = _global_steps(total=200, consumed=3 * 8, mbs=2, dp=2, grad_acc=2, steps=3)
    for rank in range(2):
        assert first[rank] + rest[rank] == full[rank]


def test_resume_with_another_global_batch_size_neither_repeats_nor_skips():
    before = _global_steps(total=500, consumed=0, mbs=2, dp=2, grad_acc=2, steps=5)  # gbs 8
    consumed = 5 * 8
    after = _global_steps(total=500, consumed=consumed, mbs=3, dp=4, grad_acc=1, steps=4)
    seen = [i for b in (before, after) for r in b.values() for mb in r for i in mb]
    assert sorted(seen) == list(range(consumed + 4 * 12))


def test_sampler_errors_and_last_batch():
    with pytest.raises(ValueError, match="consumed_samples 10 >= the dataset's 10 samples"):
        PretrainingSampler(10, 10, 1, 0, 1)
    with pytest.raises(ValueError, match="data_parallel_rank 2 not in"):
        PretrainingSampler(10, 0, 1, 2, 2)
    assert list(PretrainingSampler(5, 0, 2, 0, 1)) == [[0, 1], [2, 3]]
    assert list(PretrainingSampler(5, 0, 2, 0, 1, drop_last=False)) == [[0, 1], [2, 3], [4]]


def test_data_iterator_batches():
    torch = pytest.importorskip("torch")
    dataset = [{"text": np.arange(i, i + 5, dtype=np.int64)} for i in range(20)]
    it = build_data_iterator(dataset, consumed_samples=4, micro_batch_size=2, dp_rank=1, dp_size=2)
    batch = next(it)
    assert batch["text"].dtype == torch.int64 and batch["text"].shape == (2, 5)
    assert batch["text"][:, 0].tolist() == [6, 7]
    assert build_data_iterator(None, 0, 2, 0, 1) is None


class _Numbers:
    """A map-style dataset of `{"text": [i, i]}`, picklable for loader workers."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"text": np.array([i, i], dtype=np.int64)}


def test_loader_workers_outlive_a_stop_signal_sent_to_the_whole_job_step():
    # `scancel --signal=TERM JOB.STEP` (and SLURM's --signal before a time limit) signals every
    # process of the step: the loader workers must survive it while the rank saves.
    import os
    import signal
    import time

    from megatron.data.data_loaders import build_data_loader

    loader = build_data_loader(_Numbers(), 0, 2, 0, 1, num_workers=2)
    batches = iter(loader)
    # one batch from each worker (round robin): both have started, init function included
    seen = [next(batches)["text"][:, 0].tolist() for _ in range(2)]
    for worker in batches._workers:
        os.kill(worker.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert all(worker.is_alive() for worker in batches._workers)
    seen += [next(batches)["text"][:, 0].tolist() for _ in range(2)]
    assert seen == [[0, 1], [2, 3], [4, 5], [6, 7]]
    del batches
