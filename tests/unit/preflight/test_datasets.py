"""The datasets pre-flight check on real `.bin/.idx` pairs: whole pairs pass; a typo'd prefix
(with near matches), a truncated `.bin`, an `.idx` and `.bin` from two different datasets, a
dtype too small for the tokenizer and a missing label set are each reported, all in one go,
naming the config key, the file and what would do."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from megatron.config import config_from_dict
from megatron.preflight import ERROR, OK, run_preflight
from tests.tiny import BARE
from tests.unit.preflight.files import HF_TOKENIZER, big_vocab_tokenizer, write_pair

TINY = dict(BARE, tokenizer_type="HFTokenizer", vocab_file=str(HF_TOKENIZER))


def findings(script="train.py", shared_fs=True, **keys):
    cfg = config_from_dict({**TINY, **keys}, world_size=1, vocab_size=500)
    return [f for f in run_preflight(cfg, script, shared_fs=shared_fs) if f.check == "datasets"]


def errors(**keys) -> list[str]:
    return [f.message for f in findings(**keys) if f.level == ERROR]


def test_whole_pair_is_ok_with_its_document_count(tmp_path):
    prefix = write_pair(tmp_path / "corpus", num_docs=7)
    (found,) = findings(data_path=str(prefix))
    assert found.level == OK
    assert found.message.startswith(f"data_path: {prefix}: 7 documents, uint16, ")
    assert f"{os.path.getsize(f'{prefix}.bin'):,} bytes" in found.message


def test_typo_lists_near_matches_in_the_folder(tmp_path):
    write_pair(tmp_path / "enwik8_text_document")
    write_pair(tmp_path / "enwik9_text_document")
    (message,) = errors(data_path=str(tmp_path / "enwik8"))
    assert message.startswith(f"data_path: {tmp_path / 'enwik8'}: no dataset at ")
    assert "neither enwik8.bin nor enwik8.idx exists" in message
    assert f"did you mean {tmp_path / 'enwik8_text_document'}" in message
    assert "tools/preprocess_data.py --output-prefix PREFIX" in message


def test_missing_folder_and_missing_half_of_a_pair(tmp_path):
    prefix = write_pair(tmp_path / "corpus")
    os.remove(f"{prefix}.idx")
    (half,) = errors(data_path=str(prefix))
    assert f"{prefix}.idx does not exist (corpus.bin does)" in half
    (folder,) = errors(data_path=str(tmp_path / "nowhere" / "corpus"))
    assert f"the folder {tmp_path / 'nowhere'} does not exist" in folder


def test_truncated_bin_names_both_sizes(tmp_path):
    prefix = write_pair(tmp_path / "corpus")
    size = os.path.getsize(f"{prefix}.bin")
    with open(f"{prefix}.bin", "r+b") as f:
        f.truncate(size - 6)
    (message,) = errors(data_path=str(prefix))
    assert f"{prefix}.bin: truncated: {size - 6} bytes, but corpus.idx describes {size}" in message
    assert "re-run tools/preprocess_data.py" in message


def test_idx_and_bin_of_different_datasets(tmp_path):
    a = write_pair(tmp_path / "a", num_docs=5, seed=1)
    b = write_pair(tmp_path / "b", num_docs=9, seed=2)
    shutil.copy(f"{b}.bin", f"{a}.bin")
    (message,) = errors(data_path=str(a))
    assert "longer than its index says" in message and "does not belong together" in message


def test_not_an_index_file(tmp_path):
    prefix = write_pair(tmp_path / "corpus")
    with open(f"{prefix}.idx", "r+b") as f:
        f.write(b"TNTIDX\x00\x00")  # the legacy 'cached' format's magic
    (message,) = errors(data_path=str(prefix))
    assert "wrong magic" in message and "not a Megatron mmap index" in message


def test_uint16_cannot_hold_a_70000_token_vocabulary(tmp_path):
    vocab = big_vocab_tokenizer(tmp_path / "big.json")
    small = write_pair(tmp_path / "small", dtype=np.uint16)
    wide = write_pair(tmp_path / "wide", dtype=np.int32)
    found = findings(train_data_paths=[str(small), str(wide)], vocab_file=str(vocab))
    assert [f.level for f in found] == [ERROR, OK]
    # uint16 holds 0..65,535, the 70,000 ids need more: written independently of the check
    assert np.iinfo(np.uint16).max + 1 < 70_000
    assert found[0].message.startswith(f"train_data_paths[0]: {small}: its dtype uint16 holds")
    assert "HFTokenizer) has 70,000 tokens" in found[0].message


def test_every_bad_prefix_is_reported_at_once(tmp_path):
    good = write_pair(tmp_path / "good")
    labels = write_pair(tmp_path / "labels")
    os.remove(f"{labels}.bin")
    found = findings(
        train_data_paths=[str(good), str(tmp_path / "typo")],
        train_label_data_paths=[str(labels), str(good)],
        valid_data_paths=[str(good)],
    )
    by_prefix = {f.message.split(": ")[1]: f for f in found}
    assert by_prefix[str(good)].level == OK  # named three times, checked once
    assert by_prefix[str(good)].message.startswith(
        f"train_data_paths[0], valid_data_paths[0], train_label_data_paths[1]: {good}"
    )
    assert by_prefix[str(tmp_path / "typo")].level == ERROR
    assert by_prefix[str(labels)].message.startswith(f"train_label_data_paths[0]: {labels}")
    assert f"{labels}.bin does not exist (labels.idx does)" in by_prefix[str(labels)].message


def test_data_path_is_not_read_beside_train_data_paths(tmp_path):
    good = write_pair(tmp_path / "good")
    found = findings(data_path=str(tmp_path / "unused"), train_data_paths=[str(good)])
    assert [f.level for f in found] == [OK]


def test_no_data_at_all_and_synthetic_data():
    assert errors() == [
        "no data: set data_path (with split) or train_data_paths, or data_impl: dummy for "
        "synthetic tokens"
    ]
    (dummy,) = findings(data_impl="dummy")
    assert (dummy.level, dummy.message) == (
        OK,
        "data_impl: dummy: synthetic tokens, no files to check",
    )


@pytest.mark.parametrize("script", ["generate.py", "eval.py"])
def test_inference_scripts_read_no_datasets(tmp_path, script):
    assert findings(script, data_path=str(tmp_path / "missing")) == []


def test_shared_fs_off_skips_the_file_checks_and_says_so(tmp_path):
    cfg = config_from_dict(
        {**TINY, "data_path": str(tmp_path / "missing"), "vocab_file": str(tmp_path / "no.json")},
        world_size=1,
        vocab_size=500,
    )
    found = run_preflight(cfg, "train.py", shared_fs=False)
    skipped = {f.check: f.message for f in found if f.check in ("datasets", "tokenizer")}
    assert skipped == {
        "datasets": "skipped (preflight_shared_fs: false)",
        "tokenizer": "skipped (preflight_shared_fs: false)",
    }
    assert not [f for f in found if f.level == ERROR]
