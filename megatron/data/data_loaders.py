"""Data loaders over the datasets: one iterator per split and rank.

Loader worker processes ignore SIGTERM and SIGINT. A scheduler's stop signal (SLURM's
`--signal`, `scancel --signal=TERM JOB.STEP`, a preemption) reaches every process of a job
step, the loader workers included; the training process then finishes its step and saves a
checkpoint (`megatron/training/loop/signals.py`), which needs its workers alive. A worker whose
training process is gone still exits: torch's loader workers watch their parent; a finished
worker process kills its loader workers before it exits (`megatron/errors.py::run_worker`),
since multiprocessing's own exit handler would SIGTERM them and wait.
"""

from __future__ import annotations

import signal

from megatron.data.samplers import PretrainingSampler


def ignore_stop_signals(worker_id: int) -> None:
    """`worker_init_fn` of every loader: the stop signals are the training process's to act on."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_data_loader(
    dataset,
    consumed_samples: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    num_workers: int = 0,
    drop_last: bool = True,
    pin_memory: bool = False,
):
    """A torch DataLoader yielding this rank's micro-batches as `{"text": int64 (b, s + 1)}`
    (and `"label"`), continuing after `consumed_samples`. None when `dataset` is None."""
    if dataset is None:
        return None
    import torch

    sampler = PretrainingSampler(
        total_samples=len(dataset),
        consumed_samples=consumed_samples,
        micro_batch_size=micro_batch_size,
        data_parallel_rank=dp_rank,
        data_parallel_size=dp_size,
        drop_last=drop_last,
    )
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        worker_init_fn=ignore_stop_signals if num_workers > 0 else None,
    )


def build_data_iterator(
    dataset,
    consumed_samples: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    num_workers: int = 0,
    drop_last: bool = True,
    pin_memory: bool = False,
):
    """`iter()` of `build_data_loader(...)`, or None when `dataset` is None."""
    loader = build_data_loader(
        dataset, consumed_samples, micro_batch_size, dp_rank, dp_size, num_workers, drop_last,
        pin_memory,
    )  # fmt: skip
    return iter(loader) if loader is not None else None
