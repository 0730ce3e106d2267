"""Batch sampler that gives each data-parallel rank its slice of every global batch and resumes
from a count of consumed samples."""

from __future__ import annotations


class PretrainingSampler:
    """Yields this rank's micro-batches of sample indices, in order, from `consumed_samples`.

    The run reads the dataset as one stream: micro-step k takes the next
    `micro_batch_size * data_parallel_size` samples and rank r gets the r-th `micro_batch_size`
    of them. The only state is the number of samples consumed so far (summed over ranks and
    steps), so a resumed run continues exactly where the previous one stopped, also after the
    global batch size (micro batch, data-parallel size or accumulation) changed: nothing is
    repeated or skipped.
    """

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
    ):
        if total_samples <= 0:
            raise ValueError(f"total_samples must be positive, got {total_samples}")
        if not 0 <= consumed_samples:
            raise ValueError(f"consumed_samples must be >= 0, got {consumed_samples}")
        if consumed_samples >= total_samples:
            raise ValueError(
                f"consumed_samples {consumed_samples} >= the dataset's {total_samples} samples: "
                "the run has used all the data it was built for (raise train_iters and rebuild)"
            )
        if micro_batch_size <= 0 or data_parallel_size <= 0:
            raise ValueError(
                f"micro_batch_size ({micro_batch_size}) and data_parallel_size "
                f"({data_parallel_size}) must be positive"
            )
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(
                f"data_parallel_rank {data_parallel_rank} not in [0, {data_parallel_size})"
            )
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.drop_last = drop_last

    @property
    def _step(self) -> int:
        return self.micro_batch_size * self.data_parallel_size

    def __len__(self) -> int:
        """Micro-batches left for this rank."""
        left = self.total_samples - self.consumed_samples
        return left // self._step if self.drop_last else -(-left // self._step)

    def __iter__(self):
        step, mbs = self._step, self.micro_batch_size
        rank_start = self.data_parallel_rank * mbs
        start = self.consumed_samples
        while start + step <= self.total_samples:
            first = start + rank_start
            yield list(range(first, first + mbs))
            start += step
        if not self.drop_last and start < self.total_samples:
            # The short last batch, split as evenly as it goes.
            indices = list(range(start, self.total_samples))
            share = -(-len(indices) // self.data_parallel_size)
            mine = indices[self.data_parallel_rank * share : (self.data_parallel_rank + 1) * share]
            if mine:
                yield mine
