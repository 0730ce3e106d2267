"""SentencePiece tokenizer from a `.model` file."""

from __future__ import annotations

from megatron.data.tokenizers.base import Tokenizer, TokenizerError, require_file


class SPMTokenizer(Tokenizer):
    """A SentencePiece model (`vocab_file`). EOD: `<|endoftext|>` if the model has it (as
    GPT-NeoX's SPM tokenizer uses), else the model's own `</s>` (eos) id."""

    name = "SPMTokenizer"

    def __init__(self, vocab_file):
        import sentencepiece as spm

        path = require_file(vocab_file, "vocab_file", self.name)
        try:
            self._sp = spm.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"vocab_file: {path} is not a SentencePiece model ({e})") from None
        eod = self._sp.piece_to_id("<|endoftext|>")
        if eod == self._sp.unk_id():
            eod = self._sp.eos_id()
        if eod < 0:
            raise TokenizerError(
                f"vocab_file: {path} has neither <|endoftext|> nor an eos piece to end documents"
            )
        self._eod = eod

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def eod(self) -> int:
        return self._eod

    def tokenize(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        return self._sp.encode(texts)

    def detokenize(self, ids) -> str:
        return self._sp.decode([int(i) for i in ids])
