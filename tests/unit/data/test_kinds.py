"""The dataset kind registry: every `dataset_impl` the config accepts (and `data_impl: dummy`)
names one kind, `build_datasets` dispatches through the registry alone, and the `data` group
plus the run's values are all it reads."""

from __future__ import annotations

from typing import get_args, get_type_hints

import numpy as np
import pytest

from megatron.config.groups.data import DataConfig
from megatron.data.builders import build_datasets
from megatron.data.dummy_dataset import DummyDataset
from megatron.data.kinds import DATASET_KINDS, DatasetKind, dataset_kind, kind_name
from tests.unit.data.conftest import random_documents, write_dataset

# each `dataset_impl` the config accepts → the kind that reads it (`gpt` is read as `gpt2`)
EXPECTED = {"gpt2": "gpt2", "gpt": "gpt2", "pairwise": "pairwise"}


def test_every_config_value_names_a_kind():
    accepted = get_args(get_type_hints(DataConfig)["dataset_impl"])
    assert {v: kind_name(DataConfig(dataset_impl=v)) for v in accepted} == EXPECTED
    for value in accepted:  # synthetic data replaces whatever dataset_impl says
        assert kind_name(DataConfig(dataset_impl=value, data_impl="dummy")) == "dummy"
    assert set(DATASET_KINDS) == set(EXPECTED.values()) | {"dummy"}  # no entry unreachable
    for data_impl in get_args(get_type_hints(DataConfig)["data_impl"]):
        assert kind_name(DataConfig(data_impl=data_impl)) in DATASET_KINDS


def test_unknown_kind_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"dataset_impl: 'rlhf' is not one of gpt2, pairwise"):
        dataset_kind(DataConfig(dataset_impl="rlhf"), seq_length=8, seed=1)


def test_a_registered_kind_is_built_by_its_name(monkeypatch):
    class Constant(DatasetKind):
        def build(self, num_samples):
            return tuple([self.seq_length] * n if n else None for n in num_samples)

    monkeypatch.setitem(DATASET_KINDS, "constant", Constant)
    data = DataConfig(dataset_impl="constant")
    assert build_datasets(data, [2, 0, 1], seq_length=5, seed=0) == ([5, 5], None, [5])


def test_dummy_reads_the_run_values_not_the_files():
    data = DataConfig(data_impl="dummy")
    train, valid, test = build_datasets(data, [3, 0, 2], seq_length=6, seed=9, vocab_size=40)
    assert isinstance(train, DummyDataset) and valid is None and len(test) == 2
    assert train[0]["text"].shape == (7,) and train[2]["text"].max() < 40
    with pytest.raises(ValueError, match="padded_vocab_size"):
        build_datasets(data, [3, 0, 0], seq_length=6, seed=9)


def test_gpt_windows_are_seq_length_plus_one_from_the_group(tmp_path):
    write_dataset(tmp_path / "d", random_documents(50, seed=3))
    data = DataConfig(data_path=str(tmp_path / "d"), split="1")  # data_impl: GPT-NeoX's infer
    train, valid, test = build_datasets(data, [10, 4, 4], seq_length=7, seed=2)
    assert valid is None and test is None and len(train) >= 10
    assert train[0]["text"].dtype == np.int64 and train[0]["text"].shape == (8,)
