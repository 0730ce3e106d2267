"""Byte-level 'character' tokenizer: ids are the UTF-8 bytes of the text."""

from __future__ import annotations

from megatron.data.tokenizers.base import Tokenizer


class CharLevelTokenizer(Tokenizer):
    """Ids are UTF-8 byte values (0-255); id 0 (NUL, absent from real text) ends documents.

    `vocab_size` is 512 as in GPT-NeoX, so checkpoints keep their embedding shape; ids >= 256
    never occur and are dropped when detokenizing.
    """

    name = "CharLevelTokenizer"

    def __init__(self, vocab_size: int = 512):
        self._vocab_size = vocab_size

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eod(self) -> int:
        return 0

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenize(self, ids) -> str:
        data = bytes(int(i) for i in ids if 0 < int(i) < 256)
        return data.decode("utf-8", errors="replace")
