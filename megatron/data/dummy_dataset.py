"""Synthetic token data for benchmarking without files (`data_impl: dummy`).

`DummyDataset` has the interface of `GPTDataset` (`len`, and `{"text": int64 (s + 1,)}` per
sample), so the sampler, the data loader and `ModelBatches` see nothing different from real
data and the throughput measured on it is that of the real batch path; only the disk reads and
index building are left out. Sample `i` of split `name` is drawn uniformly from
`[0, vocab_size)` by a generator seeded with `(seed, split, i)`: the same on every rank and in
every run with that seed, independent of the order in which samples are read (so resuming from
a checkpoint reads the same tokens as the unbroken run).
"""

from __future__ import annotations

import numpy as np

# A fixed number per split, so train, valid and test draw different tokens from one seed.
_SPLIT_STREAMS = {"train": 0, "valid": 1, "test": 2}


class DummyDataset:
    """`num_samples` synthetic samples of `seq_length + 1` token ids below `vocab_size`."""

    def __init__(self, name: str, num_samples: int, seq_length: int, vocab_size: int, seed: int):
        if name not in _SPLIT_STREAMS:
            raise ValueError(f"dummy dataset: split {name!r} is not one of {list(_SPLIT_STREAMS)}")
        if vocab_size < 1:
            raise ValueError(f"dummy dataset: vocab_size must be positive, got {vocab_size}")
        self.name = name
        self.num_samples = int(num_samples)
        self.seq_length = int(seq_length)
        self.vocab_size = int(vocab_size)
        self.seed = int(seed)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"{self.name} dummy dataset: sample {idx} out of range for {n}")
        idx %= n
        rng = np.random.default_rng((self.seed, _SPLIT_STREAMS[self.name], idx))
        text = rng.integers(0, self.vocab_size, size=self.seq_length + 1, dtype=np.int64)
        return {"text": text}


def build_dummy_datasets(
    num_samples: list[int], seq_length: int, vocab_size: int | None, seed: int
) -> tuple[DummyDataset | None, ...]:
    """(train, valid, test) dummy datasets; a split asked for no samples is None."""
    if vocab_size is None:
        raise ValueError(
            "data_impl: dummy needs the vocabulary size (padded_vocab_size, derived from the "
            "tokenizer); set tokenizer_type (and vocab_file where it needs one)"
        )
    return tuple(
        DummyDataset(name, n, seq_length, vocab_size, seed) if n > 0 else None
        for name, n in zip(_SPLIT_STREAMS, num_samples)
    )
