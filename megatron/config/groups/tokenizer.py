"""Tokenizer settings (`cfg.tokenizer`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class TokenizerConfig:
    tokenizer_type: Literal[
        "GPT2BPETokenizer", "HFTokenizer", "HFGPT2Tokenizer", "SPMTokenizer", "CharLevelTokenizer"
    ] = "GPT2BPETokenizer"
    """Tokenizer implementation."""

    vocab_file: str | None = None
    """GPT-2 `vocab.json`, a Hugging Face `tokenizer.json` or a sentencepiece `.model`."""

    merge_file: str | None = None
    """GPT-2 `merges.txt` (GPT2BPETokenizer only)."""

    make_vocab_size_divisible_by: int = 128
    """Pad the vocabulary to a multiple of this times the tensor-parallel size."""
