"""GPT dataset: documents cut into fixed samples of `seq_length + 1` tokens across boundaries."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from megatron.data.index_mapping import build_index_mappings, load_index_mappings
from megatron.data.indexed_dataset import MMapIndexedDataset


class GPTDataset:
    """Sample `i` is `{"text": int64[seq_length + 1]}` (plus `"label"`, same shape, from a
    label dataset when given: per-token targets with -100 where the loss is masked).

    Samples run across document boundaries (documents are separated by the EOD token the
    preprocessing appended), consecutive samples share one token, and their order is the seeded
    shuffle of `index_mapping`. `len()` counts every sample of the epochs needed to supply
    `num_samples`, so it is at least `num_samples`.
    """

    def __init__(
        self,
        name: str,
        indexed_dataset: MMapIndexedDataset,
        documents: np.ndarray,
        num_samples: int,
        seq_length: int,
        seed: int,
        cache_prefix: str | Path | None = None,
        label_dataset: MMapIndexedDataset | None = None,
        use_shared_fs: bool = True,
    ):
        self.name = name
        self.indexed_dataset = indexed_dataset
        self.label_dataset = label_dataset
        self.seq_length = seq_length
        documents = np.asarray(documents)
        n_items = len(indexed_dataset)
        if documents.size and (documents.min() < 0 or documents.max() >= n_items):
            raise ValueError(
                f"{indexed_dataset.prefix}: documents outside [0, {n_items}) requested"
            )
        if label_dataset is not None and not np.array_equal(
            label_dataset.sizes, indexed_dataset.sizes
        ):
            raise ValueError(
                f"label dataset {label_dataset.prefix} does not match {indexed_dataset.prefix}: "
                "every document must have as many labels as tokens"
            )
        self.num_documents = int(documents.size)
        mappings = build_index_mappings(
            name,
            cache_prefix if cache_prefix is not None else indexed_dataset.prefix,
            indexed_dataset.sizes,
            documents,
            num_samples,
            seq_length,
            seed,
            use_shared_fs=use_shared_fs,
        )
        self.doc_idx = mappings.doc_idx
        self.sample_idx = mappings.sample_idx
        self.shuffle_idx = mappings.shuffle_idx
        self.num_epochs = mappings.num_epochs
        self._paths = mappings.paths
        self.index_built = mappings.built

    def __getstate__(self):
        # DataLoader workers get the dataset pickled: send the .npy paths, not the arrays.
        state = dict(self.__dict__)
        for kind in self._paths:
            del state[kind]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.update(load_index_mappings(self._paths))

    def __len__(self) -> int:
        return self.shuffle_idx.shape[0]

    def _gather(self, dataset: MMapIndexedDataset, idx: int) -> np.ndarray:
        doc_f, offset_f = (int(x) for x in self.sample_idx[idx])
        doc_l, offset_l = (int(x) for x in self.sample_idx[idx + 1])
        if doc_f == doc_l:
            return dataset.get(int(self.doc_idx[doc_f]), offset_f, offset_l - offset_f + 1)
        parts = [dataset.get(int(self.doc_idx[doc_f]), offset_f)]
        parts += [dataset.get(int(self.doc_idx[i])) for i in range(doc_f + 1, doc_l)]
        parts.append(dataset.get(int(self.doc_idx[doc_l]), 0, offset_l + 1))
        return np.concatenate(parts)

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"{self.name} dataset: sample {idx} out of range for {n} samples")
        shuffled = int(self.shuffle_idx[idx])
        sample = {"text": self._gather(self.indexed_dataset, shuffled).astype(np.int64)}
        if self.label_dataset is not None:
            sample["label"] = self._gather(self.label_dataset, shuffled).astype(np.int64)
        return sample
