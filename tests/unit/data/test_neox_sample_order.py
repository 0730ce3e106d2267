"""The datasets serve GPT-NeoX's sample sequence: same config, data and seed, same tokens.

The expected sequence comes from GPT-NeoX's algorithm written out here in numpy and plain
loops (from `megatron/data/data_utils.py`, `gpt2_dataset.py`, `blendable_dataset.py` and
`helpers.cpp`): the `split` document ranges; per dataset the epochs needed for its samples,
the documents of all epochs shuffled together, the sample walk over them and the sample
shuffle, all from one `RandomState(seed)`; for explicit paths each dataset sized
ceil(N × w × 1.005) and the blend built greedily (largest lag behind its weight first) over
the datasets' total length. The datasets under test are the ones the trainer builds
(`build_train_valid_test_datasets`), read from real `.bin/.idx` files.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from megatron.config.groups.data import DataConfig
from megatron.data.builders import build_train_valid_test_datasets
from tests.unit.data.conftest import write_dataset

SEQ, SEED = 8, 1234


def neox_split(split: str, size: int) -> list[int]:
    """`get_train_valid_test_split_`."""
    parts = [float(s) for s in split.split(",")] + [0.0, 0.0]
    parts = parts[:3]
    parts = [p / sum(parts) for p in parts]
    index = [0]
    for p in parts:
        index.append(index[-1] + int(round(p * float(size))))
    diff = index[-1] - size
    return [index[0]] + [i - diff for i in index[1:]]


def neox_index(sizes, documents, num_samples, seq_length, seed):
    """`GPT2Dataset`'s (doc_idx, sample_idx, shuffle_idx) and its length."""
    tokens = int(np.sum(sizes[documents]))
    epochs = 0
    while True:
        epochs += 1
        if (epochs * tokens - 1) // seq_length >= num_samples:
            break
    rng = np.random.RandomState(seed=seed)
    doc_idx = np.mgrid[0:epochs, 0 : len(documents)][1]
    doc_idx[:] = documents
    doc_idx = doc_idx.reshape(-1).astype(np.int32)
    rng.shuffle(doc_idx)
    total = (epochs * tokens - 1) // seq_length
    sample_idx = np.zeros((total + 1, 2), dtype=np.int64)
    d, offset = 0, 0
    for k in range(1, total + 1):
        remaining = seq_length + 1
        while remaining != 0:
            length = int(sizes[doc_idx[d]]) - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                d, offset = d + 1, 0
        sample_idx[k] = (d, offset)
    shuffle_idx = np.arange(total, dtype=np.uint32)
    rng.shuffle(shuffle_idx)
    length = min(shuffle_idx.shape[0] - 1, sample_idx.shape[0] - 1)
    return doc_idx, sample_idx, shuffle_idx, length


def neox_tokens(docs, index, k):
    """Sample k of a `GPT2Dataset`."""
    doc_idx, sample_idx, shuffle_idx, _ = index
    j = shuffle_idx[k]
    (first, start), (last, end) = sample_idx[j], sample_idx[j + 1]
    if first == last:
        return docs[doc_idx[first]][start : end + 1]
    parts = [docs[doc_idx[first]][start:]]
    parts += [docs[doc_idx[i]] for i in range(first + 1, last)]
    parts.append(docs[doc_idx[last]][: end + 1])
    return np.concatenate(parts)


def neox_weights_by_num_docs(counts, alpha):
    """`weights_by_num_docs`."""
    if len(counts) == 1:
        return [1.0]
    probs = [c / sum(counts) for c in counts]
    tempered = [p**alpha for p in probs]
    tempered = [t / sum(tempered) for t in tempered]
    weights = [t * (1 - p) for t, p in zip(tempered, probs)]
    return [w / sum(weights) for w in weights]


def neox_blend(weights, lengths):
    """`BlendableDataset` + `build_blending_indices`: (dataset, sample) of every position."""
    w = np.array(weights, dtype=np.float64)
    w /= np.sum(w)
    size = sum(lengths)
    dataset_index = np.zeros(size, dtype=np.uint8)
    sample_index = np.zeros(size, dtype=np.int64)
    taken = [0] * len(w)
    for i in range(size):
        seen = max(float(i), 1.0)
        best, best_error = 0, w[0] * seen - taken[0]
        for d in range(1, len(w)):
            error = w[d] * seen - taken[d]
            if error > best_error:
                best, best_error = d, error
        dataset_index[i], sample_index[i] = best, taken[best]
        taken[best] += 1
    return dataset_index, sample_index


def neox_explicit(all_docs, weights, num_samples):
    """The blend of explicit paths: (tokens of every sample the run reads, dataset_index,
    per-dataset indexes)."""
    total = sum(weights)
    weights = [w / total for w in weights]
    counts = [int(math.ceil(num_samples * w * 1.005)) for w in weights]
    indexes = []
    for docs, n in zip(all_docs, counts):
        sizes = np.array([len(d) for d in docs], dtype=np.int32)
        indexes.append(neox_index(sizes, np.arange(len(docs), dtype=np.int32), n, SEQ, SEED))
    dataset_index, sample_index = neox_blend(weights, [ix[3] for ix in indexes])
    tokens = [
        neox_tokens(all_docs[d], indexes[d], k)
        for d, k in zip(dataset_index[:num_samples], sample_index[:num_samples])
    ]
    return tokens, dataset_index[:num_samples], indexes


def documents(n_docs, seed, max_len=40):
    """Documents of 1..max_len tokens, every 17th one empty."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(1, 1000, size=rng.integers(1, max_len)) for _ in range(n_docs)]
    for i in range(0, n_docs, 17):
        docs[i] = np.zeros(0, dtype=np.int64)
    return docs


def _cfg(**data):
    return SimpleNamespace(
        data=DataConfig(**data),
        model=SimpleNamespace(seq_length=SEQ, padded_vocab_size=None),
        training=SimpleNamespace(seed=SEED),
    )


def _write(tmp_path, name, docs) -> str:
    write_dataset(tmp_path / name, docs)
    return str(tmp_path / name)


def _assert_same_samples(ours, expected_tokens):
    assert len(ours) >= len(expected_tokens)
    for i, expected in enumerate(expected_tokens):
        np.testing.assert_array_equal(ours[i]["text"], expected, err_msg=f"sample {i}")


def _assert_same_index(ours, neox):
    doc_idx, sample_idx, shuffle_idx, _ = neox
    np.testing.assert_array_equal(ours.doc_idx, doc_idx)
    np.testing.assert_array_equal(ours.sample_idx, sample_idx)
    np.testing.assert_array_equal(ours.shuffle_idx, shuffle_idx)


BLENDS = {
    "two 3:1": ([120, 80], [3.0, 1.0], 230),
    "three uneven": ([60, 90, 40], [0.2, 0.5, 0.3], 400),
    "three equal, several epochs": ([25, 30, 20], [1.0, 1.0, 1.0], 700),
    "small share, many epochs": ([100, 12], [0.9, 0.1], 900),
}


@pytest.mark.parametrize("name", list(BLENDS))
def test_blend_of_explicit_paths_is_neox(tmp_path, name):
    doc_counts, weights, n = BLENDS[name]
    all_docs = [documents(c, seed=10 + i) for i, c in enumerate(doc_counts)]
    paths = [_write(tmp_path, f"d{i}", docs) for i, docs in enumerate(all_docs)]
    cfg = _cfg(train_data_paths=paths, train_data_weights=weights)
    train, _, _ = build_train_valid_test_datasets(cfg, [n, 0, 0])
    expected, dataset_index, indexes = neox_explicit(all_docs, weights, n)
    np.testing.assert_array_equal(train.dataset_index[:n], dataset_index)
    for ours, neox in zip(train.datasets, indexes):
        _assert_same_index(ours, neox)
    _assert_same_samples(train, expected)


def test_blend_share_of_exactly_two_epochs_gets_neox_third_epoch(tmp_path):
    """When a dataset's share of the run is exactly two epochs of samples, NeoX's 0.5% margin
    builds it over three epochs: another shuffle, other samples."""
    all_docs = [documents(90, seed=30), documents(50, seed=31)]
    paths = [_write(tmp_path, f"e{i}", docs) for i, docs in enumerate(all_docs)]
    per_epoch = (sum(len(d) for d in all_docs[0]) - 1) // SEQ
    n = int(2 * per_epoch / 0.75)  # dataset 0 supplies 3/4 of the samples: two epochs' worth
    cfg = _cfg(train_data_paths=paths, train_data_weights=[3, 1])
    train, _, _ = build_train_valid_test_datasets(cfg, [n, 0, 0])
    expected, dataset_index, indexes = neox_explicit(all_docs, [3, 1], n)
    assert indexes[0][0].size == 3 * len(all_docs[0])  # NeoX's doc_idx spans three epochs
    np.testing.assert_array_equal(train.dataset_index[:n], dataset_index)
    _assert_same_index(train.datasets[0], indexes[0])
    _assert_same_samples(train, expected)


def test_weight_by_num_documents_is_neox(tmp_path):
    all_docs = [documents(c, seed=20 + i) for i, c in enumerate([150, 40, 70])]
    paths = [_write(tmp_path, f"w{i}", docs) for i, docs in enumerate(all_docs)]
    cfg = _cfg(train_data_paths=paths, weight_by_num_documents=True, weighted_sampler_alpha=0.3)
    train, _, _ = build_train_valid_test_datasets(cfg, [500, 0, 0])
    weights = neox_weights_by_num_docs([150, 40, 70], 0.3)
    expected, dataset_index, _ = neox_explicit(all_docs, weights, 500)
    np.testing.assert_array_equal(train.dataset_index[:500], dataset_index)
    _assert_same_samples(train, expected)


def test_one_explicit_path_is_sized_like_a_neox_blend(tmp_path):
    """NeoX wraps a lone path in a blend, built for ceil(N × 1.005) samples: when N is exactly
    one epoch's samples, the 0.5% asks for a second epoch, which reshuffles everything."""
    docs = documents(70, seed=3)
    path = _write(tmp_path, "one", docs)
    n = (sum(len(d) for d in docs) - 1) // SEQ
    valid_docs = documents(30, seed=4)
    cfg = _cfg(train_data_paths=[path], valid_data_paths=[_write(tmp_path, "v", valid_docs)])
    train, valid, _ = build_train_valid_test_datasets(cfg, [n, 37, 0])
    expected, _, (index,) = neox_explicit([docs], [1.0], n)
    _assert_same_index(train, index)
    _assert_same_samples(train, expected)
    expected, _, _ = neox_explicit([valid_docs], [1.0], 37)
    _assert_same_samples(valid, expected)


@pytest.mark.parametrize("counts", [[200, 60, 30], [1500, 9, 16]], ids=["one epoch", "epochs"])
def test_data_path_split_is_neox(tmp_path, counts):
    """One `data_path` cut by `split`: each split's GPTDataset is NeoX's, bit for bit, also
    over several epochs."""
    docs = documents(120, seed=5)
    path = _write(tmp_path, "split", docs)
    cfg = _cfg(data_path=path, split="949,50,1")
    datasets = build_train_valid_test_datasets(cfg, counts)
    bounds = neox_split("949,50,1", len(docs))
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    for i, (ours, n) in enumerate(zip(datasets, counts)):
        documents_i = np.arange(bounds[i], bounds[i + 1], dtype=np.int32)
        if documents_i.size == 0:
            assert ours is None
            continue
        neox = neox_index(sizes, documents_i, n, SEQ, SEED)
        _assert_same_index(ours, neox)
        _assert_same_samples(ours, [neox_tokens(docs, neox, k) for k in range(n)])
