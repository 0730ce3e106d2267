"""Train/valid/test datasets from the `data` group and the run's values: split, explicit
paths, blends."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from megatron.config.groups.data import DataConfig
from megatron.data.blendable_dataset import BlendableDataset
from megatron.data.builders import (
    build_train_valid_test_datasets,
    num_samples_from_config,
    train_samples_per_epoch,
    train_valid_test_num_samples,
)
from megatron.data.kinds import parse_split
from tests.unit.data.conftest import random_documents, write_dataset


def _cfg(**data):
    return SimpleNamespace(
        data=DataConfig(**data),
        model=SimpleNamespace(seq_length=8, padded_vocab_size=None),
        training=SimpleNamespace(
            seed=1, train_iters=10, eval_interval=5, eval_iters=2, train_batch_size=4
        ),
    )


def test_parse_split():
    assert parse_split("949,50,1", 1000) == [0, 949, 999, 1000]
    assert parse_split("8/1/1", 10) == [0, 8, 9, 10]
    assert parse_split("1", 7) == [0, 7, 7, 7]
    assert parse_split("969, 30, 1", 33) == [0, 32, 33, 33]
    for bad in ("a,b", "1,2,3,4", "0,0", "-1,2"):
        with pytest.raises(ValueError, match="split"):
            parse_split(bad, 10)


def test_num_samples():
    assert train_valid_test_num_samples(100, 10, 5, 8) == [800, 11 * 5 * 8, 40]
    assert num_samples_from_config(_cfg()) == [40, 3 * 2 * 4, 8]


def test_data_path_split(tmp_path):
    write_dataset(tmp_path / "d", random_documents(100, seed=0))
    cfg = _cfg(data_path=str(tmp_path / "d"), split="80,10,10")
    train, valid, test = build_train_valid_test_datasets(cfg, [40, 24, 8])
    assert (train.num_documents, valid.num_documents, test.num_documents) == (80, 10, 10)
    assert set(train.doc_idx.tolist()) == set(range(80))
    assert set(valid.doc_idx.tolist()) == set(range(80, 90))
    assert len(train) >= 40 and train[0]["text"].shape == (9,)
    _, _, none = build_train_valid_test_datasets(_cfg(data_path=str(tmp_path / "d"),
                                                      split="90,10"), [4, 4, 4])  # fmt: skip
    assert none is None
    assert train_samples_per_epoch(cfg) == (int(train.indexed_dataset.sizes[:80].sum()) - 1) // 8


def test_explicit_paths_blend_and_labels(tmp_path):
    for name, seed in (("a", 1), ("b", 2)):
        docs = random_documents(30, seed=seed)
        write_dataset(tmp_path / name, docs)
        write_dataset(tmp_path / f"{name}_lab", docs, dtype=np.int32)
    cfg = _cfg(
        train_data_paths=[str(tmp_path / "a"), str(tmp_path / "b")],
        train_data_weights=[3.0, 1.0],
        train_label_data_paths=[str(tmp_path / "a_lab"), str(tmp_path / "b_lab")],
        valid_data_paths=[str(tmp_path / "b")],
        test_data_paths=None,
        data_cache_path=str(tmp_path / "cache"),
    )
    train, valid, test = build_train_valid_test_datasets(cfg, [100, 10, 0])
    assert isinstance(train, BlendableDataset) and len(train) == 100
    assert np.bincount(train.dataset_index).tolist() == [75, 25]
    sample = train[3]
    np.testing.assert_array_equal(sample["label"], sample["text"])
    assert valid is not None and "label" not in valid[0] and test is None
    assert list((tmp_path / "cache").glob("a_train_indexmap_*_doc_idx.npy"))
    by_docs = _cfg(train_data_paths=[str(tmp_path / "a"), str(tmp_path / "b")],
                   weight_by_num_documents=True, weighted_sampler_alpha=1.0)  # fmt: skip
    blended, _, _ = build_train_valid_test_datasets(by_docs, [10, 0, 0])
    assert blended.weights == [0.5, 0.5]


def test_config_errors(tmp_path):
    write_dataset(tmp_path / "x_text_document", [[1, 2, 3]])
    with pytest.raises(FileNotFoundError, match=r"data_path: no .*/x.bin/.idx pair \(did you mean"):
        build_train_valid_test_datasets(_cfg(data_path=str(tmp_path / "x")), [1, 0, 0])
    with pytest.raises(ValueError, match="set `data_path`"):
        build_train_valid_test_datasets(_cfg(), [1, 0, 0])
    p = str(tmp_path / "x_text_document")
    with pytest.raises(ValueError, match="train_data_weights has 2 entries"):
        build_train_valid_test_datasets(
            _cfg(train_data_paths=[p], train_data_weights=[1, 2]), [1, 0, 0]
        )
    with pytest.raises(ValueError, match="data_impl: 'cached' is not supported"):
        build_train_valid_test_datasets(_cfg(data_path=p, data_impl="cached"), [1, 0, 0])
