"""GPT samples: windows of the shuffled document stream, deterministic cached indices."""

from __future__ import annotations

import numpy as np
import pytest

from megatron.data.gpt_dataset import GPTDataset
from megatron.data.index_mapping import num_epochs_needed
from megatron.data.indexed_dataset import MMapIndexedDataset
from tests.unit.data.conftest import random_documents, write_dataset


@pytest.fixture
def corpus(tmp_path):
    docs = random_documents(60, seed=3)
    write_dataset(tmp_path / "c", docs)
    return MMapIndexedDataset(tmp_path / "c"), docs


def _dataset(ds, num_samples=100, seq_length=16, seed=5, documents=None, **kw):
    documents = np.arange(len(ds)) if documents is None else documents
    return GPTDataset("train", ds, documents, num_samples, seq_length, seed, **kw)


def test_samples_are_windows_of_the_document_stream(corpus):
    ds, docs = corpus
    gpt = _dataset(ds, num_samples=300, seq_length=16)
    stream = np.concatenate([docs[d] for d in gpt.doc_idx])  # documents in doc_idx order
    assert len(gpt) >= 300 and gpt.num_epochs == num_epochs_needed(ds.num_tokens, 16, 300)
    seen = set()
    for i in range(len(gpt)):
        sample = gpt[i]["text"]
        j = int(gpt.shuffle_idx[i])
        assert sample.dtype == np.int64 and sample.shape == (17,)
        assert np.array_equal(sample, stream[j * 16 : j * 16 + 17])
        seen.add(j)
    assert seen == set(range(len(gpt)))  # a permutation: every sample once


def test_round_trip_text_through_dataset(tmp_path):
    """Text -> .bin/.idx -> GPTDataset -> text: unshuffled, samples rebuild the corpus."""
    from megatron.data.tokenizers import CharLevelTokenizer

    tok = CharLevelTokenizer()
    texts = ["First document.", "Second, longer document!", "Third one."]
    write_dataset(tmp_path / "t", [tok.tokenize(t) + [tok.eod] for t in texts])
    ds = MMapIndexedDataset(tmp_path / "t")
    gpt = _dataset(ds, num_samples=4, seq_length=8, seed=0)
    order = np.argsort(gpt.shuffle_idx)  # sample i of the stream sits at order[i]
    pieces = [gpt[int(order[0])]["text"]] + [gpt[int(k)]["text"][1:] for k in order[1:]]
    stream = np.concatenate(pieces)
    docs_in_order = [texts[d] for d in gpt.doc_idx]
    expected = "".join(t + "\0" for t in docs_in_order)
    assert "".join(map(chr, stream)) == expected[: len(stream)]


def test_indices_deterministic_and_cached(corpus, tmp_path):
    ds, _ = corpus
    a = _dataset(ds, cache_prefix=tmp_path / "one" / "c")
    b = _dataset(ds, cache_prefix=tmp_path / "two" / "c")
    assert a.index_built and b.index_built
    for name in ("doc_idx", "sample_idx", "shuffle_idx"):
        files_a = sorted((tmp_path / "one").glob(f"*_{name}.npy"))
        files_b = sorted((tmp_path / "two").glob(f"*_{name}.npy"))
        assert len(files_a) == 1 and files_a[0].read_bytes() == files_b[0].read_bytes()
    again = _dataset(ds, cache_prefix=tmp_path / "one" / "c")
    assert not again.index_built  # loaded from the cache
    np.testing.assert_array_equal(again.shuffle_idx, a.shuffle_idx)
    other_seed = _dataset(ds, seed=6, cache_prefix=tmp_path / "one" / "c")
    assert other_seed.index_built and not np.array_equal(other_seed.shuffle_idx, a.shuffle_idx)
    assert len(list((tmp_path / "one").glob("*_doc_idx.npy"))) == 2
    assert not list(tmp_path.rglob("*.tmp-*"))  # written atomically


def test_matches_gpt_neox_rng_sequence(corpus, tmp_path):
    """doc_idx then shuffle_idx from one RandomState(seed), as GPT-NeoX builds them."""
    ds, _ = corpus
    gpt = _dataset(ds, num_samples=50, seed=11, cache_prefix=tmp_path / "c")
    rng = np.random.RandomState(11)
    doc_idx = np.tile(np.arange(len(ds), dtype=np.int32), gpt.num_epochs)
    rng.shuffle(doc_idx)
    shuffle = np.arange(len(gpt), dtype=np.uint32)
    rng.shuffle(shuffle)
    np.testing.assert_array_equal(gpt.doc_idx, doc_idx)
    np.testing.assert_array_equal(gpt.shuffle_idx, shuffle)


def test_label_dataset(tmp_path, corpus):
    ds, docs = corpus
    labels = [np.where(np.arange(len(d)) % 3 == 0, -100, d) for d in docs]
    write_dataset(tmp_path / "labels", labels, dtype=np.int32)
    gpt = _dataset(ds, label_dataset=MMapIndexedDataset(tmp_path / "labels"))
    sample = gpt[5]
    masked = sample["label"] == -100
    assert masked.any()
    np.testing.assert_array_equal(sample["label"][~masked], sample["text"][~masked])
    write_dataset(tmp_path / "short", [d[:-1] if len(d) > 1 else d for d in docs], np.int32)
    with pytest.raises(ValueError, match="does not match"):
        _dataset(ds, label_dataset=MMapIndexedDataset(tmp_path / "short"))


def test_errors(corpus):
    ds, _ = corpus
    with pytest.raises(ValueError, match=r"\(valid split\): 0 documents hold 0 tokens"):
        GPTDataset("valid", ds, np.array([], np.int32), 10, 16, 1)
    gpt = _dataset(ds, num_samples=10)
    with pytest.raises(IndexError, match="out of range"):
        gpt[len(gpt)]


def test_pickles_by_path(corpus, tmp_path):
    import pickle

    ds, _ = corpus
    gpt = _dataset(ds, cache_prefix=tmp_path / "c")
    payload = pickle.dumps(gpt)
    assert len(payload) < 2000  # the index arrays travel as file paths
    clone = pickle.loads(payload)
    assert np.array_equal(clone[3]["text"], gpt[3]["text"]) and len(clone) == len(gpt)
