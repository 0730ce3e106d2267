"""The tokenizer pre-flight check: the files load (once per process, shared with deepy.py's
vocabulary lookup), and a missing, unset or unreadable file is an error naming the key, the
file and what the tokenizer type reads."""

from __future__ import annotations

from megatron.config import config_from_dict
from megatron.preflight import ERROR, OK, run_preflight
from megatron.preflight.tokenizer import load_tokenizer
from tests.tiny import BARE
from tests.unit.preflight.files import HF_TOKENIZER


def tokenizer_findings(script="generate.py", **keys):
    cfg = config_from_dict({**BARE, **keys}, world_size=1, vocab_size=500)
    return [f for f in run_preflight(cfg, script) if f.check == "tokenizer"]


def test_loads_and_reports_the_vocabulary():
    (found,) = tokenizer_findings(tokenizer_type="HFTokenizer", vocab_file=str(HF_TOKENIZER))
    assert found.level == OK
    assert found.message == f"HFTokenizer (vocab_file {HF_TOKENIZER}) loads: vocabulary 500"


def test_loaded_once_per_process():
    cfg = config_from_dict(
        {**BARE, "tokenizer_type": "HFTokenizer", "vocab_file": str(HF_TOKENIZER)},
        world_size=1,
        vocab_size=500,
    )
    assert load_tokenizer(cfg.tokenizer) is load_tokenizer(cfg.tokenizer)


def test_missing_merge_file(tmp_path):
    merges = tmp_path / "merges.txt"
    (found,) = tokenizer_findings(
        tokenizer_type="GPT2BPETokenizer", vocab_file=str(HF_TOKENIZER), merge_file=str(merges)
    )
    assert found.level == ERROR
    assert found.message == (
        f"cannot load the tokenizer: merge_file: {merges} does not exist (needed by "
        "GPT2BPETokenizer); tokenizer_type GPT2BPETokenizer reads vocab_file (GPT-2 vocab.json) "
        "and merge_file (GPT-2 merges.txt)"
    )


def test_unset_and_unreadable_vocab_file(tmp_path):
    (unset,) = tokenizer_findings(tokenizer_type="SPMTokenizer")
    assert "needs `vocab_file`, which is not set" in unset.message
    assert "reads vocab_file (a SentencePiece .model)" in unset.message
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json")
    (bad,) = tokenizer_findings(tokenizer_type="HFTokenizer", vocab_file=str(broken))
    assert f"vocab_file: {broken} is not a tokenizer.json" in bad.message
    assert "reads vocab_file (a Hugging Face tokenizer.json)" in bad.message
