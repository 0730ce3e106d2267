"""Blending several datasets by weight, as GPT-NeoX blends them.

Each dataset is built for `neox_num_samples` samples (its share of the run plus 0.5%, which
fixes how many epochs its index spans and so its shuffle), and the blend takes sample i from
the dataset whose share lags its weight the most (GPT-NeoX's `build_blending_indices`), so
after any n samples dataset d has supplied weights[d] * n of them, within one. The same
config, data and seed therefore give GPT-NeoX's sample sequence.
"""

from __future__ import annotations

import math

import numpy as np

from megatron.data.index_helpers import index_helpers


def normalize_weights(weights, what: str = "weights") -> list[float]:
    """Weights scaled to sum to 1; raises naming `what` for negative or all-zero weights."""
    weights = [float(w) for w in weights]
    if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"{what}: {weights} must be non-negative with a positive sum")
    total = sum(weights)
    return [w / total for w in weights]


def weights_by_num_docs(doc_counts, alpha: float) -> list[float]:
    """GPT-NeoX's `weight_by_num_documents`: dataset d gets p_d**alpha * (1 - p_d), normalised,
    where p_d is its share of all documents. alpha = 1 keeps sizes, alpha < 1 up-samples small
    datasets."""
    counts = [int(c) for c in doc_counts]
    if len(counts) == 1:
        return [1.0]
    probs = normalize_weights(counts, "document counts")
    tempered = normalize_weights([p**alpha for p in probs], "tempered document counts")
    return normalize_weights([t * (1 - p) for t, p in zip(tempered, probs)], "blending weights")


# GPT-NeoX builds each blended dataset 0.5% larger than its share of the run.
NEOX_OVERSAMPLE = 1.005


def neox_num_samples(weights, num_samples: int) -> list[int]:
    """Samples each dataset of a blend is built for: ceil(num_samples × w × 1.005) for the
    normalised weights `weights` (GPT-NeoX's `get_normalized_weights_and_num_samples`)."""
    return [int(math.ceil(num_samples * w * NEOX_OVERSAMPLE)) for w in weights]


def blending_indices(weights, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset of each sample uint8[size], its index in that dataset int64[size])."""
    return index_helpers().build_blending_indices(np.asarray(weights, np.float64), size)


class BlendableDataset:
    """The first `size` samples of the blend of `datasets` by `weights` (GPT-NeoX's
    `BlendableDataset`, whose length is the datasets' total: a run reads only this prefix,
    which does not depend on the total). Each dataset is read in its own (shuffled) order."""

    def __init__(self, datasets, weights, size: int):
        if len(datasets) != len(weights):
            raise ValueError(f"{len(datasets)} datasets but {len(weights)} weights")
        normalize_weights(weights)  # raises on negative or all-zero weights
        # GPT-NeoX normalises the (already normalised) weights once more, in numpy.
        w = np.array(weights, dtype=np.float64)
        w /= np.sum(w)
        self.datasets = list(datasets)
        self.weights = w.tolist()
        self.size = int(size)
        self.dataset_index, self.dataset_sample_index = blending_indices(w, self.size)
        needed = np.bincount(self.dataset_index, minlength=len(self.datasets))
        for dataset, n in zip(self.datasets, needed):
            if len(dataset) < n:
                raise ValueError(
                    f"blend needs {n} samples from {getattr(dataset, 'name', dataset)}, "
                    f"which has {len(dataset)}"
                )

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int):
        if not -self.size <= idx < self.size:
            raise IndexError(f"blended dataset: sample {idx} out of range for {self.size}")
        d = int(self.dataset_index[idx])
        return self.datasets[d][int(self.dataset_sample_index[idx])]
