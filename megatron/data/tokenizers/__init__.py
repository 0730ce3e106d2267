"""Tokenizers, chosen by `tokenizer_type`, and the padded vocabulary size.

build_tokenizer(cfg)                      # cfg.tokenizer.{tokenizer_type, vocab_file, merge_file}
make_tokenizer("GPT2BPETokenizer", vocab_file=..., merge_file=...)
pad_vocab_size(50257, make_vocab_size_divisible_by=128, tp_size=2)  # -> 50432
"""

from __future__ import annotations

import difflib

from megatron.config.derive import pad_vocab_size
from megatron.data.tokenizers.base import Tokenizer, TokenizerError
from megatron.data.tokenizers.char import CharLevelTokenizer
from megatron.data.tokenizers.hf import GPT2BPETokenizer, HFGPT2Tokenizer, HFTokenizer
from megatron.data.tokenizers.spm import SPMTokenizer

# tokenizer_type -> (class, which of vocab_file / merge_file it takes)
TOKENIZER_TYPES: dict[str, tuple[type[Tokenizer], tuple[str, ...]]] = {
    "GPT2BPETokenizer": (GPT2BPETokenizer, ("vocab_file", "merge_file")),
    "HFGPT2Tokenizer": (HFGPT2Tokenizer, ("vocab_file", "merge_file")),
    "HFTokenizer": (HFTokenizer, ("vocab_file",)),
    "SPMTokenizer": (SPMTokenizer, ("vocab_file",)),
    "CharLevelTokenizer": (CharLevelTokenizer, ()),
}


def make_tokenizer(tokenizer_type: str, vocab_file=None, merge_file=None) -> Tokenizer:
    """Build the tokenizer named `tokenizer_type` from local files."""
    if tokenizer_type not in TOKENIZER_TYPES:
        close = difflib.get_close_matches(str(tokenizer_type), TOKENIZER_TYPES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TokenizerError(
            f"tokenizer_type: unknown {tokenizer_type!r}{hint}; valid: {', '.join(TOKENIZER_TYPES)}"
        )
    cls, keys = TOKENIZER_TYPES[tokenizer_type]
    files = {"vocab_file": vocab_file, "merge_file": merge_file}
    return cls(*(files[k] for k in keys))


def build_tokenizer(cfg) -> Tokenizer:
    """The tokenizer described by `cfg.tokenizer` (tokenizer_type, vocab_file, merge_file)."""
    tok = cfg.tokenizer
    return make_tokenizer(
        tok.tokenizer_type, getattr(tok, "vocab_file", None), getattr(tok, "merge_file", None)
    )


__all__ = [
    "CharLevelTokenizer",
    "GPT2BPETokenizer",
    "HFGPT2Tokenizer",
    "HFTokenizer",
    "SPMTokenizer",
    "TOKENIZER_TYPES",
    "Tokenizer",
    "TokenizerError",
    "build_tokenizer",
    "make_tokenizer",
    "pad_vocab_size",
]
