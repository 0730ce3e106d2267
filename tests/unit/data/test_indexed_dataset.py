"""The `.bin/.idx` format: byte layout field by field, reading, and errors for bad files."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest

from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.indexed_format import IndexedDatasetError, best_fitting_dtype
from megatron.data.indexed_writer import IndexedDatasetWriter
from tests.unit.data.conftest import random_documents, write_dataset


def test_idx_layout_field_by_field(tmp_path):
    prefix = tmp_path / "d"
    with IndexedDatasetWriter(prefix, np.uint16) as w:
        w.add_document([5, 6, 7])
        w.add_item([1])  # a two-item document (GPT-NeoX's sentence splitting)
        w.add_item([2, 3])
        w.end_document()
    raw = (tmp_path / "d.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack("<Q", raw[9:17]) == (1,)  # version
    assert raw[17] == 8  # dtype code of uint16
    assert struct.unpack("<QQ", raw[18:34]) == (3, 3)  # items, doc_idx entries
    assert struct.unpack("<3i", raw[34:46]) == (3, 1, 2)  # sizes
    assert struct.unpack("<3q", raw[46:70]) == (0, 6, 8)  # byte pointers
    assert struct.unpack("<3q", raw[70:94]) == (0, 1, 3)  # doc_idx
    assert len(raw) == 94
    assert (tmp_path / "d.bin").read_bytes() == np.array([5, 6, 7, 1, 2, 3], "<u2").tobytes()
    ds = MMapIndexedDataset(prefix)
    assert (len(ds), ds.num_docs) == (3, 2)
    assert ds.document(1).tolist() == [1, 2, 3] and ds.document(0).tolist() == [5, 6, 7]


def test_int32_layout_and_dtype_choice(tmp_path):
    assert best_fitting_dtype(50257) is np.uint16
    assert best_fitting_dtype(65500) is np.int32
    write_dataset(tmp_path / "d", [[70000, 1]], dtype=np.int32)
    raw = (tmp_path / "d.idx").read_bytes()
    assert raw[17] == 4
    assert struct.unpack("<q", raw[34 + 4 : 34 + 12]) == (0,)
    ds = MMapIndexedDataset(tmp_path / "d")
    assert ds.dtype == np.int32 and ds[0].tolist() == [70000, 1]


def test_read_back(tmp_path):
    docs = random_documents(50)
    write_dataset(tmp_path / "d", docs)
    ds = MMapIndexedDataset(tmp_path / "d")
    assert len(ds) == ds.num_docs == 50
    assert ds.sizes.tolist() == [len(d) for d in docs]
    assert ds.doc_idx.tolist() == list(range(51))
    assert ds.num_tokens == sum(len(d) for d in docs)
    for i, doc in enumerate(docs):
        assert ds[i].tolist() == doc.tolist()
    assert ds.get(3, offset=1, length=2).tolist() == docs[3][1:3].tolist()
    assert [a.tolist() for a in ds[1:3]] == [d.tolist() for d in docs[1:3]]
    with pytest.raises(IndexError, match="out of range"):
        ds.get(0, offset=len(docs[0]), length=1)
    clone = pickle.loads(pickle.dumps(ds))  # DataLoader workers get it pickled
    assert clone[7].tolist() == docs[7].tolist()


def test_bulk_writer_matches_item_writer(tmp_path):
    docs = random_documents(20, seed=1)
    write_dataset(tmp_path / "a", docs)
    with IndexedDatasetWriter(tmp_path / "b", np.uint16) as w:
        w.add_documents(np.concatenate(docs[:5]), [len(d) for d in docs[:5]])
        w.add_documents(np.concatenate(docs[5:]), [len(d) for d in docs[5:]])
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"a{ext}").read_bytes() == (tmp_path / f"b{ext}").read_bytes()


def test_empty_dataset(tmp_path):
    write_dataset(tmp_path / "e", [])
    ds = MMapIndexedDataset(tmp_path / "e")
    assert len(ds) == 0 and ds.num_tokens == 0


def test_token_out_of_dtype_range(tmp_path):
    with pytest.raises(ValueError, match="do not fit"):
        write_dataset(tmp_path / "d", [[70000]], dtype=np.uint16)
    assert not list(tmp_path.iterdir())  # aborted: no files left at all


def test_exception_keeps_previous_pair(tmp_path):
    write_dataset(tmp_path / "d", [[1, 2]])
    before = (tmp_path / "d.idx").read_bytes()
    with pytest.raises(RuntimeError):
        with IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
            w.add_document([9, 9, 9])
            raise RuntimeError("killed")
    assert (tmp_path / "d.idx").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "d.idx"]


def test_unfinished_writer_leaves_no_final_names(tmp_path):
    w = IndexedDatasetWriter(tmp_path / "d", np.uint16)
    w.add_document([1, 2, 3])
    # a killed process never reaches finalize(): only temporary names exist
    assert not (tmp_path / "d.idx").exists() and not (tmp_path / "d.bin").exists()
    w.abort()


@pytest.fixture
def pair(tmp_path):
    write_dataset(tmp_path / "d", [[1, 2, 3], [4, 5]])
    return tmp_path / "d"


def _patch(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def test_wrong_magic(pair):
    _patch(pair.with_suffix(".idx"), 0, b"TNTIDX\x00\x00\x00")
    with pytest.raises(IndexedDatasetError, match=r"d\.idx: wrong magic"):
        MMapIndexedDataset(pair)


def test_wrong_version(pair):
    _patch(pair.with_suffix(".idx"), 9, struct.pack("<Q", 2))
    with pytest.raises(IndexedDatasetError, match="unsupported index version 2"):
        MMapIndexedDataset(pair)


def test_unknown_dtype(pair):
    _patch(pair.with_suffix(".idx"), 17, bytes([42]))
    with pytest.raises(IndexedDatasetError, match="unknown dtype code 42"):
        MMapIndexedDataset(pair)


def test_truncated_index(pair):
    idx = pair.with_suffix(".idx")
    idx.write_bytes(idx.read_bytes()[:-5])
    with pytest.raises(IndexedDatasetError, match=r"d\.idx: truncated"):
        MMapIndexedDataset(pair)
    idx.write_bytes(idx.read_bytes()[:20])
    with pytest.raises(IndexedDatasetError, match="truncated header"):
        MMapIndexedDataset(pair)


def test_truncated_bin(pair):
    b = pair.with_suffix(".bin")
    b.write_bytes(b.read_bytes()[:-2])
    with pytest.raises(IndexedDatasetError, match=r"d\.bin: truncated: 8 bytes.* describes 10"):
        MMapIndexedDataset(pair)


def test_missing_files(pair):
    pair.with_suffix(".bin").unlink()
    with pytest.raises(IndexedDatasetError, match="data file not found"):
        MMapIndexedDataset(pair)
    with pytest.raises(IndexedDatasetError, match="index file not found"):
        MMapIndexedDataset(pair.parent / "nothing")
