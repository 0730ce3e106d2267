"""`pack_impl` and `allow_chopped` of the GPT dataset against GPT-NeoX's rules, written here
independently from `gpt2_dataset.py`'s description: the RNG calls in GPT-NeoX's order, whole
documents appended until the next one overflows `seq_length + 1`, one document per sample,
the next sample's first token appended, then cut or padded (tokens 0, labels -100)."""

from __future__ import annotations

import numpy as np
import pytest

from megatron.data.gpt_dataset import GPTDataset
from megatron.data.indexed_dataset import MMapIndexedDataset
from tests.unit.data.conftest import random_documents, write_dataset

SEQ = 6


def neox_pack_until_overflow(sizes, usable, n_docs, num_samples, seq, seed):
    """Lists of documents per sample, in GPT-NeoX's loop (skips wrap like any document)."""
    rng = np.random.RandomState(seed)
    shuffle = np.arange(num_samples)
    rng.shuffle(shuffle)
    order = np.arange(n_docs)
    rng.shuffle(order)
    samples, cursor, running = [], 0, 0
    while len(samples) < num_samples:
        doc = int(order[cursor])
        if usable(doc, seq + 1):
            if running == 0:
                samples.append([doc])
                running += sizes[doc]
            elif running + sizes[doc] > seq + 1:
                samples.append([doc])
                running = sizes[doc]
            else:
                samples[-1].append(doc)
                running += sizes[doc]
        cursor += 1
        if cursor == n_docs:
            cursor = 0
            rng.shuffle(order)
    return samples, shuffle


def neox_unpacked(usable, n_docs, num_samples, seq, seed):
    rng = np.random.RandomState(seed)
    shuffle = np.arange(num_samples)
    rng.shuffle(shuffle)
    docs, doc = [], 0
    while len(docs) <= num_samples:
        if usable(doc, seq):
            docs.append(doc)
        doc = (doc + 1) % n_docs
    return [[d] for d in docs], shuffle


def expected_samples(groups, shuffle, texts, labels, seq):
    """(tokens, labels) of each served sample: its documents, the next group's first token,
    cut or padded to seq + 1."""
    out = []
    for k in shuffle:
        tok = [t for d in groups[k] for t in texts[d]]
        lab = [t for d in groups[k] for t in labels[d]]
        if k + 1 < len(groups) and len(texts[groups[k + 1][0]]):
            tok.append(texts[groups[k + 1][0]][0])
            lab.append(labels[groups[k + 1][0]][0])
        tok, lab = tok[: seq + 1], lab[: seq + 1]
        pad = seq + 1 - len(tok)
        out.append((tok + [0] * pad, lab + [-100] * pad))
    return out


def _docs_and_labels(seed=0):
    docs = [list(map(int, d)) for d in random_documents(12, seed=seed, max_len=10)]
    labels = [[t if i % 3 else -100 for i, t in enumerate(d)] for d in docs]
    labels[4] = [-100] * len(docs[4])  # no loss at all: skipped by both padded packings
    return docs, labels


def _dataset(tmp_path, docs, labels, pack_impl, allow_chopped, num_samples, seed):
    write_dataset(tmp_path / "t", docs)
    write_dataset(tmp_path / "l", labels, dtype=np.int32)
    return GPTDataset(
        "train", MMapIndexedDataset(tmp_path / "t"), np.arange(len(docs)), num_samples, SEQ,
        seed, label_dataset=MMapIndexedDataset(tmp_path / "l"), pack_impl=pack_impl,
        allow_chopped=allow_chopped,
    )  # fmt: skip


@pytest.mark.parametrize("pack_impl", ["pack_until_overflow", "unpacked"])
@pytest.mark.parametrize("allow_chopped", [True, False])
@pytest.mark.parametrize("seed", [1, 7])
def test_padded_packings_match_neox_rules(tmp_path, pack_impl, allow_chopped, seed):
    docs, labels = _docs_and_labels(seed)
    sizes = [len(d) for d in docs]

    def usable(doc, window):
        if not allow_chopped and sizes[doc] > SEQ + 1:
            return False
        return not all(v == -100 for v in labels[doc][:window])

    n = 25
    if pack_impl == "unpacked":
        groups, shuffle = neox_unpacked(usable, len(docs), n, SEQ, seed)
    else:
        groups, shuffle = neox_pack_until_overflow(sizes, usable, len(docs), n, SEQ, seed)
    want = expected_samples(groups, shuffle, docs, labels, SEQ)
    ds = _dataset(tmp_path, docs, labels, pack_impl, allow_chopped, n, seed)
    assert len(ds) == n
    for i, (tokens, label) in enumerate(want):
        sample = ds[i]
        assert sample["text"].tolist() == tokens, i
        assert sample["label"].tolist() == label, i
        assert sample["text"].dtype == np.int64 and sample["label"].dtype == np.int64
    served = {d for k in shuffle for d in groups[k]}
    assert 4 not in served
    if not allow_chopped:
        assert all(sizes[d] <= SEQ + 1 for d in served)


def test_unpacked_by_hand(tmp_path):
    """Three documents, seq_length 4: each its own sample plus the next one's first token."""
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]]
    write_dataset(tmp_path / "t", docs)
    order = np.arange(4)
    np.random.RandomState(3).shuffle(order)
    rows = {0: [1, 2, 3, 4, 0], 1: [4, 5, 6, 0, 0], 2: [6, 7, 8, 9, 10], 3: [1, 2, 3, 4, 0]}
    masks = {0: [1, 2, 3, 4, -100], 1: [4, 5, 6, -100, -100], 2: [6, 7, 8, 9, 10]}
    masks[3] = masks[0]
    ds = GPTDataset("t", MMapIndexedDataset(tmp_path / "t"), np.arange(3), 4, 4, 3,
                    pack_impl="unpacked")  # fmt: skip
    for i, k in enumerate(order):
        assert ds[i]["text"].tolist() == rows[k] and ds[i]["label"].tolist() == masks[k]
    # allow_chopped: false skips the 6-token document (over seq_length + 1 = 5 tokens)
    ds = GPTDataset("u", MMapIndexedDataset(tmp_path / "t"), np.arange(3), 4, 4, 3,
                    pack_impl="unpacked", allow_chopped=False)  # fmt: skip
    assert sorted(tuple(ds[i]["text"].tolist()) for i in range(4)) == sorted(
        [(1, 2, 3, 4, 0), (4, 5, 1, 0, 0), (1, 2, 3, 4, 0), (4, 5, 1, 0, 0)]
    )


def test_index_files_are_named_by_pack_impl(tmp_path):
    docs, labels = _docs_and_labels()
    _dataset(tmp_path, docs, labels, "unpacked", False, 5, 1)
    _dataset(tmp_path, docs, labels, "pack_until_overflow", True, 5, 1)
    GPTDataset("train", MMapIndexedDataset(tmp_path / "t"), np.arange(12), 5, SEQ, 1)
    names = sorted(p.name for p in tmp_path.glob("t_train_indexmap_*_doc_idx.npy"))
    assert len(names) == 3
    assert any("_unpackedpi_" in n and "_ac_" not in n for n in names)
    assert any("_pack_until_overflowpi_ac_" in n for n in names)
    assert any("_packedpi_ac_" in n for n in names)


def test_packed_is_unchanged_and_never_pads(tmp_path):
    docs, _ = _docs_and_labels()
    write_dataset(tmp_path / "t", docs)
    ds = GPTDataset("train", MMapIndexedDataset(tmp_path / "t"), np.arange(12), 5, SEQ, 1)
    assert set(ds[0]) == {"text"} and all(ds[i]["text"].shape == (SEQ + 1,) for i in range(5))


def test_no_usable_document_is_refused(tmp_path):
    docs = [[1, 2, 3, 4, 5, 6, 7, 8, 9]] * 3
    write_dataset(tmp_path / "t", docs)
    with pytest.raises(ValueError, match=r"t: none of its 3 documents is no longer than 7"):
        GPTDataset("train", MMapIndexedDataset(tmp_path / "t"), np.arange(3), 4, SEQ, 1,
                   pack_impl="pack_until_overflow", allow_chopped=False)  # fmt: skip
