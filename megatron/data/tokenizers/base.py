"""The interface every tokenizer offers to preprocessing, datasets and generation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from pathlib import Path


class TokenizerError(ValueError):
    """A tokenizer cannot be built from the given type and files."""


def require_file(path, key: str, tokenizer_type: str) -> Path:
    """`path` as a Path, or a TokenizerError naming the config key when it is unset or missing."""
    if not path:
        raise TokenizerError(f"tokenizer_type {tokenizer_type} needs `{key}`, which is not set")
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"{key}: {path} does not exist (needed by {tokenizer_type})")
    return path


class Tokenizer(ABC):
    """Text <-> token ids, with the end-of-document id used to separate documents.

    Nothing here downloads: every tokenizer is built from local files (or none).
    """

    name: str = "Tokenizer"

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (before padding for the embedding)."""

    @property
    @abstractmethod
    def eod(self) -> int:
        """The end-of-document id appended between documents."""

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Ids of `text`, including any special tokens the tokenizer itself adds."""

    @abstractmethod
    def detokenize(self, ids) -> str:
        """Text of `ids` (special tokens dropped where the tokenizer marks them so)."""

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of several texts; subclasses with a batched backend override this."""
        return [self.tokenize(t) for t in texts]

    def tokenize_without_specials(self, text: str) -> list[int]:
        """Ids of `text` without the special tokens (BOS, EOS) the tokenizer adds around a text,
        for text that writes its own (a rendered chat template), as transformers'
        apply_chat_template tokenizes."""
        return self.tokenize(text)

    @cached_property
    def adds_eod(self) -> bool:
        """Whether `tokenize` already ends every text with `eod` (then never append another).

        Some tokenizer files carry a post-processor that appends an end-of-sequence token; adding
        one more per document doubled the separators in the IBM 7B run's data.
        """
        ids = self.tokenize("a")
        return bool(ids) and ids[-1] == self.eod

    def __repr__(self) -> str:
        return f"{self.name}(vocab_size={self.vocab_size}, eod={self.eod})"
