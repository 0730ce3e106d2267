"""Pre-flight refusals through `deepy.py`: a typo'd `data_path`, a truncated `.bin`, an `.idx`
and `.bin` of two different datasets, a uint16 dataset under a 70,000-token tokenizer, a
missing tokenizer file and a malformed hostfile each exit with status 2 and a message naming
the key and file and what would do, and start nothing: the worker (a `train.py` that leaves a
file behind if it ever runs) never runs and no runner backend is called. `--dry-run` reports
the same problems; `preflight_shared_fs: false` skips the file checks and says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.tiny import BARE, write_config
from tests.unit.preflight.files import big_vocab_tokenizer, write_pair

pytestmark = pytest.mark.slow  # subprocesses, though none trains: about 3 s of CPU each

REPO = Path(__file__).resolve().parents[2]
FAKE_BIN = REPO / "tests" / "e2e" / "fake_bin"
MARKER_WORKER = "import pathlib, sys\npathlib.Path(sys.argv[0]).with_suffix('.ran').touch()\n"
TINY = dict(BARE, tokenizer_type="CharLevelTokenizer")


def deepy(tmp_path: Path, settings: dict, *flags: str) -> subprocess.CompletedProcess:
    """Run deepy.py on a `train.py` marker worker with `settings` (over TINY) as one config."""
    worker = tmp_path / "worker" / "train.py"
    worker.parent.mkdir(exist_ok=True)
    worker.write_text(MARKER_WORKER)
    config = write_config(tmp_path, {**TINY, **settings})
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(
        PYTHONPATH=str(REPO),
        PATH=f"{FAKE_BIN}{os.pathsep}{env['PATH']}",
        FAKE_LAUNCHER_LOG=str(tmp_path / "calls.jsonl"),
    )
    return subprocess.run(
        [sys.executable, "deepy.py", str(worker), str(config), *flags],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def assert_refused(proc, tmp_path: Path, *expected: str) -> None:
    """Exit 2, every expected text on stderr, and nothing started."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for text in expected:
        assert text in proc.stderr, proc.stderr
    assert not (tmp_path / "worker" / "train.ran").exists()
    assert not (tmp_path / "calls.jsonl").exists()  # no pdsh/srun/mpirun either
    assert "launching" not in proc.stderr


def test_typo_in_data_path_suggests_the_real_prefix(tmp_path):
    real = write_pair(tmp_path / "data" / "enwik8_text_document")
    typo = tmp_path / "data" / "enwik8"
    proc = deepy(tmp_path, dict(data_path=str(typo)))
    assert_refused(
        proc,
        tmp_path,
        "deepy.py: pre-flight found 1 problem(s):",
        f"datasets: data_path: {typo}: no dataset at {typo}",
        f"did you mean {real}?",
    )


def test_truncated_bin_in_a_dry_run(tmp_path):
    prefix = write_pair(tmp_path / "corpus")
    size = os.path.getsize(f"{prefix}.bin")
    os.truncate(f"{prefix}.bin", size - 4)
    proc = deepy(tmp_path, dict(data_path=str(prefix)), "--dry-run")
    assert_refused(
        proc, tmp_path, f"data_path: {prefix}: {prefix}.bin: truncated: {size - 4} bytes, but "
        f"corpus.idx describes {size}", "re-run tools/preprocess_data.py to rebuild the pair"
    )  # fmt: skip
    assert "pre-flight:" not in proc.stdout  # the dry run's report is printed only when it passes


def test_idx_and_bin_that_do_not_belong_together(tmp_path):
    a = write_pair(tmp_path / "a", num_docs=4, seed=1)
    b = write_pair(tmp_path / "b", num_docs=9, seed=2)
    shutil.copy(f"{b}.bin", f"{a}.bin")
    proc = deepy(tmp_path, dict(train_data_paths=[str(b), str(a)]))
    assert_refused(
        proc, tmp_path, f"datasets: train_data_paths[1]: {a}: {a}.bin: longer than its index "
        "says", "the pair does not belong together"
    )  # fmt: skip


def test_uint16_dataset_under_a_70000_token_vocabulary(tmp_path):
    vocab = big_vocab_tokenizer(tmp_path / "tokenizer.json")
    prefix = write_pair(tmp_path / "corpus", dtype=np.uint16)
    settings = dict(data_path=str(prefix), tokenizer_type="HFTokenizer", vocab_file=str(vocab))
    proc = deepy(tmp_path, settings, "--dry-run")
    assert_refused(
        proc, tmp_path, f"data_path: {prefix}: its dtype uint16 holds ids below 65,536, but the "
        "tokenizer (HFTokenizer) has 70,000 tokens"
    )  # fmt: skip


@pytest.mark.parametrize("flags", [(), ("--dry-run",)], ids=["launch", "dry-run"])
def test_missing_merge_file(tmp_path, flags):
    prefix = write_pair(tmp_path / "corpus")
    vocab, merges = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab.write_text("{}")
    settings = dict(
        data_path=str(prefix), tokenizer_type="GPT2BPETokenizer", vocab_file=str(vocab),
        merge_file=str(merges),
    )  # fmt: skip
    proc = deepy(tmp_path, settings, *flags)
    assert_refused(
        proc, tmp_path, f"cannot load the tokenizer: merge_file: {merges} does not exist",
        "tokenizer_type GPT2BPETokenizer reads vocab_file (GPT-2 vocab.json) and merge_file"
    )  # fmt: skip


def test_malformed_hostfile(tmp_path):
    prefix = write_pair(tmp_path / "corpus")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=1\nworker-1 slot=1\n")
    proc = deepy(tmp_path, dict(data_path=str(prefix), hostfile=str(hostfile)))
    assert_refused(
        proc, tmp_path, f"hostfile {hostfile}, line 2 ('worker-1 slot=1'): expected exactly one "
        "'slots=N'"
    )  # fmt: skip


def test_dry_run_lists_the_checks_and_shared_fs_off_skips_the_file_checks(tmp_path):
    prefix = write_pair(tmp_path / "corpus", num_docs=6)
    proc = deepy(tmp_path, dict(data_path=str(prefix)), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"  [ok] datasets: data_path: {prefix}: 6 documents, uint16, " in proc.stdout
    assert "  [ok] tokenizer: CharLevelTokenizer (no files) loads: vocabulary 512" in proc.stdout
    missing = tmp_path / "not_on_this_node"
    off = dict(data_path=str(missing), preflight_shared_fs=False)
    proc = deepy(tmp_path, off, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "pre-flight datasets: skipped (preflight_shared_fs: false)" in proc.stderr
    assert "  [warning] datasets: skipped (preflight_shared_fs: false)" in proc.stdout
