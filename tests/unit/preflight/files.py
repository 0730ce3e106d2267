"""Real files for the pre-flight tests: `.bin/.idx` pairs and a tokenizer of 70,000 tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from megatron.data.indexed_writer import IndexedDatasetWriter

DATA = Path(__file__).resolve().parents[2] / "data"
HF_TOKENIZER = DATA / "tiny_hf_tokenizer.json"  # byte-level BPE, 500 tokens


def write_pair(prefix: Path, num_docs: int = 5, dtype=np.uint16, seed: int = 0) -> Path:
    """Write `num_docs` documents of 10-40 random ids below 256 as `{prefix}.bin/.idx`."""
    rng = np.random.default_rng(seed)
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for _ in range(num_docs):
            writer.add_document(rng.integers(1, 256, rng.integers(10, 40)))
    return prefix


def big_vocab_tokenizer(path: Path, vocab_size: int = 70_000) -> Path:
    """A Hugging Face word-level tokenizer.json of `vocab_size` tokens (too many for uint16)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1}
    vocab.update({f"w{i}": i for i in range(2, vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path
