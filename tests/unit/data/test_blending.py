"""Blending: exact proportions over every prefix, weights by document count."""

from __future__ import annotations

import numpy as np
import pytest

from megatron.data.blendable_dataset import (
    BlendableDataset,
    blending_indices,
    normalize_weights,
    weights_by_num_docs,
)


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.2], [0.9, 0.1], [1, 1, 1, 1], [0.02, 0.98]])
def test_every_prefix_within_one_sample_of_its_share(weights):
    w = np.array(normalize_weights(weights))
    dataset_index, sample_index = blending_indices(w, 5000)
    counts = np.zeros((5000, len(w)))
    counts[np.arange(5000), dataset_index] = 1
    running = np.cumsum(counts, axis=0)  # (n, datasets): samples taken after n+1 steps
    ideal = np.arange(1, 5001)[:, None] * w[None, :]
    assert np.abs(running - ideal).max() <= 1.0
    for d in range(len(w)):  # each dataset is read in order 0, 1, 2, ...
        mine = sample_index[dataset_index == d]
        np.testing.assert_array_equal(mine, np.arange(mine.size))


def test_weights_by_num_docs():
    assert weights_by_num_docs([10], 0.3) == [1.0]
    w = weights_by_num_docs([100, 300, 600], 1.0)
    p = np.array([0.1, 0.3, 0.6])
    expected = p * (1 - p) / (p * (1 - p)).sum()
    np.testing.assert_allclose(w, expected)
    tempered = weights_by_num_docs([100, 300, 600], 0.3)
    assert tempered[0] > w[0] and tempered[2] < w[2]  # alpha < 1 up-samples small sets


def test_blendable_dataset_reads_through():
    a, b = [f"a{i}" for i in range(100)], [f"b{i}" for i in range(100)]
    blend = BlendableDataset([a, b], [3, 1], 40)
    items = [blend[i] for i in range(len(blend))]
    assert sum(x.startswith("a") for x in items) == 30
    assert [x for x in items if x.startswith("b")] == [f"b{i}" for i in range(10)]
    with pytest.raises(ValueError, match="needs 30 samples from"):
        BlendableDataset([a[:5], b], [3, 1], 40)
    with pytest.raises(ValueError, match="must be non-negative"):
        normalize_weights([1, -1])
