"""Tokenizers backed by the Hugging Face `tokenizers` library: a `tokenizer.json`, or GPT-2 BPE."""

from __future__ import annotations

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from megatron.data.tokenizers.base import Tokenizer, TokenizerError, require_file

# Tried in order when looking for the end-of-document token of a tokenizer.json.
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[SEP]")


class _BackendTokenizer(Tokenizer):
    """Shared encode/decode over a `tokenizers.Tokenizer` (Rust, batched)."""

    def __init__(self, backend: _HFTokenizer, eod: int):
        self._backend = backend
        self._eod = eod

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def eod(self) -> int:
        return self._eod

    def tokenize(self, text: str) -> list[int]:
        return self._backend.encode(text).ids

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch_fast (tokenizers >= 0.21) skips character offsets: same ids, less work.
        encode = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        return [e.ids for e in encode(texts)]

    def tokenize_without_specials(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids) -> str:
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)


class HFTokenizer(_BackendTokenizer):
    """A Hugging Face `tokenizer.json` (`vocab_file`), e.g. GPT-NeoX-20B's or Pythia's.

    The end-of-document token is the first of EOD_CANDIDATES the vocabulary holds.
    """

    name = "HFTokenizer"

    def __init__(self, vocab_file):
        path = require_file(vocab_file, "vocab_file", self.name)
        try:
            backend = _HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust loader raises a bare Exception
            raise TokenizerError(f"vocab_file: {path} is not a tokenizer.json ({e})") from None
        eod = next((i for t in EOD_CANDIDATES if (i := backend.token_to_id(t)) is not None), None)
        if eod is None:
            raise TokenizerError(
                f"vocab_file: {path} has no end-of-document token; expected one of "
                f"{', '.join(EOD_CANDIDATES)}"
            )
        super().__init__(backend, eod)


class GPT2BPETokenizer(_BackendTokenizer):
    """GPT-2's byte-level BPE from `vocab_file` (vocab.json) and `merge_file` (merges.txt).

    Byte-level BPE with GPT-2's pre-tokenizing regex: the same ids as OpenAI's reference
    encoder and GPT-NeoX's `GPT2BPETokenizer`, computed by the Rust `tokenizers` library.
    """

    name = "GPT2BPETokenizer"

    def __init__(self, vocab_file, merge_file):
        vocab = require_file(vocab_file, "vocab_file", self.name)
        merges = require_file(merge_file, "merge_file", self.name)
        try:
            bpe = models.BPE.from_file(str(vocab), str(merges))
        except Exception as e:
            raise TokenizerError(
                f"vocab_file/merge_file: cannot load GPT-2 BPE from {vocab} and {merges} ({e})"
            ) from None
        backend = _HFTokenizer(bpe)
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        eod = backend.token_to_id("<|endoftext|>")
        if eod is None:
            raise TokenizerError(f"vocab_file: {vocab} has no <|endoftext|> token")
        super().__init__(backend, eod)


class HFGPT2Tokenizer(GPT2BPETokenizer):
    """GPT-NeoX's `HFGPT2Tokenizer`: GPT-2 BPE from local `vocab_file` + `merge_file`, with the
    padding token `<|padding|>` added (vocab 50,258). Never downloads the `gpt2` hub files."""

    name = "HFGPT2Tokenizer"

    def __init__(self, vocab_file, merge_file):
        super().__init__(vocab_file, merge_file)
        self._backend.add_special_tokens(["<|padding|>"])
