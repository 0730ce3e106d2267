"""What a person sees when a worker stops, through `deepy.py` on CPU ranks.

A user error that only the workers can see (`preflight_shared_fs: false` skips the pre-flight
checks that would have caught it before launch): the message once, with the ranks it stopped,
no traceback on the console and no folder of them to look in (printed with `--verbose`), exit
status 2. A bug in a worker: its traceback on the console once, nothing from the rank that
was waiting for it in a collective, a non-zero status other than 2, and the folder holding
every rank's traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.launcher.failures import USER_ERROR_EXIT, read_failures
from tests.distributed import free_port
from tests.tiny import char_corpus, tiny_settings, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BUG_WORKER = REPO / "tests" / "e2e" / "workers" / "fail_on_rank.py"
TIMEOUT = 600  # under load, a shared 2-core machine takes minutes


def deepy(script: str | Path, folder: Path, *flags: str, **changes):
    """Run `deepy.py script` on a tiny run config under `folder`."""
    settings = tiny_settings(
        folder, train_iters=2, eval_interval=0, do_test=False, load=None,
        master_port=free_port(), **changes,
    )  # fmt: skip
    config = write_config(folder, settings)
    return subprocess.run(
        [sys.executable, "deepy.py", str(script), str(config), *flags],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def errors_folder(out: str) -> Path:
    return Path(out.split("deepy.py: tracebacks: ")[1].split()[0])


def test_a_missing_data_file_on_two_ranks_is_one_message(tmp_path):
    missing = tmp_path / "no_such" / "corpus"
    proc = deepy(
        "train.py", tmp_path / "run", num_gpus=2, data_path=str(missing), preflight_shared_fs=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == USER_ERROR_EXIT, out[-4000:]
    message = f"data_path: no {missing}.bin/.idx pair"
    assert out.count(message) == 1, out[-4000:]
    assert f"deepy.py: error on ranks 0-1: {message}" in out
    assert "Traceback" not in out and "--megatron_config" not in out
    assert "tracebacks:" not in out  # the message is all there is to say


def test_a_truncated_data_file_with_verbose_shows_the_traceback(tmp_path):
    corpus = char_corpus()
    prefix = tmp_path / "corpus"
    shutil.copy(f"{corpus}.idx", f"{prefix}.idx")
    data = Path(f"{corpus}.bin").read_bytes()
    Path(f"{prefix}.bin").write_bytes(data[: len(data) // 2])
    proc = deepy(
        "train.py", tmp_path / "run", "--verbose",
        num_gpus=1, data_path=str(prefix), preflight_shared_fs=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == USER_ERROR_EXIT, out[-4000:]
    message = f"{prefix}.bin: truncated: {len(data) // 2} bytes"
    assert out.count("Traceback (most recent call last)") == 1, out[-4000:]
    report = out[out.index("Traceback (most recent call last)") :]
    assert f"IndexedDatasetError: {message}" in report  # the traceback, printed once by deepy.py
    assert f"deepy.py: error on rank 0: {message}" in report  # then the message


def test_a_bug_keeps_its_traceback_and_the_waiting_rank_is_quiet(tmp_path):
    proc = deepy(BUG_WORKER, tmp_path / "run", num_gpus=2)
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, USER_ERROR_EXIT), out[-4000:]
    assert out.count("Traceback (most recent call last)") == 1, out[-4000:]
    assert out.count("RuntimeError: deliberate bug on rank 1") == 1
    assert "deepy.py: rank 1 failed (traceback above)" in out
    assert "Connection" not in out and "--megatron_config" not in out  # rank 0's broken barrier
    folder = errors_folder(out)
    kinds = {f.rank: f.kind for f in read_failures(str(folder))}
    assert kinds[1] == "bug" and kinds.get(0, "collateral") == "collateral"
    shutil.rmtree(folder)
