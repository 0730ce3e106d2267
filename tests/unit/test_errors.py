"""`megatron/errors.py`: which exceptions are user errors, and what a worker or a tool does on
one.

The entry points' wrapper runs here in a subprocess (it ends the process), as deepy.py's
workers run it: with an errors folder it writes the record and prints nothing for a user
error, the traceback for a bug; without one it prints `rank N: <message>`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.config import ConfigError
from megatron.errors import PACKAGE, is_user_error, run_tool
from megatron.launcher.failures import ERRORS_DIR_FLAG, USER_ERROR_EXIT, read_failures
from megatron.training.checkpoint.disk_space import CheckpointSaveError
from megatron.training.optim.lion import Lion
from megatron.training.step.loss_scaling import TooManySkippedSteps

REPO = Path(__file__).resolve().parents[2]


def _raised(source: str, filename: Path) -> BaseException:
    """The exception `source` raises when its code lives in `filename`."""
    try:
        exec(compile(source, str(filename), "exec"), {})
    except Exception as error:  # noqa: BLE001
        return error
    raise AssertionError("no exception")


def test_the_rooms_error_classes_are_user_errors():
    assert is_user_error(ConfigError("train_iters: must be >= 1"))  # not even raised
    assert is_user_error(TooManySkippedSteps("3 steps in a row skipped"))
    assert is_user_error(CheckpointSaveError("could not save checkpoint: 0 B free"))  # the disk
    assert not is_user_error(ValueError("not raised by us"))


def test_a_value_error_raised_by_our_code_is_a_user_error():
    import torch

    with pytest.raises(ValueError, match="Lion lr must be >= 0") as caught:
        Lion([torch.nn.Parameter(torch.zeros(1))], lr=-1.0)
    assert is_user_error(caught.value)
    with pytest.raises(ValueError) as caught:  # torch's own refusal: a bug of ours if reached
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=-1.0)
    assert not is_user_error(caught.value)


def test_only_a_raise_statement_in_the_package_makes_a_user_error():
    inside, outside = PACKAGE / "not_a_module.py", REPO / "tests" / "not_a_module.py"
    assert is_user_error(_raised("raise ValueError('bad value')", inside))
    assert is_user_error(_raised("raise FileNotFoundError('no such file')", inside))
    assert not is_user_error(_raised("a, b = [1, 2, 3]", inside))  # Python's own ValueError
    assert not is_user_error(_raised("raise ValueError('bad value')", outside))
    assert not is_user_error(_raised("raise RuntimeError('bug')", inside))


WORKER = """
import sys
from megatron.errors import run_worker

def main(argv):
    if argv[0] == "user":
        from megatron.config import ConfigError
        raise ConfigError("seq_length: 7 is not a multiple of 8")
    if argv[0] == "disk":  # a checkpoint write meeting a full disk, as CheckpointIO.save does
        from megatron.training.checkpoint.disk_space import stop_on_failure
        with stop_on_failure("/ckpt", "global_step2", None, lambda path: 0):
            raise OSError(28, "No space left on device")
    raise RuntimeError("a bug")

run_worker(main)
"""


def _worker(tmp_path: Path, *args: str, rank: str = "3") -> subprocess.CompletedProcess:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=REPO,
        env={**os.environ, "RANK": rank, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_user_error_is_recorded_silently(tmp_path):
    proc = _worker(tmp_path, "user", ERRORS_DIR_FLAG, str(tmp_path))
    assert proc.returncode == USER_ERROR_EXIT
    assert proc.stdout + proc.stderr == ""
    [failure] = read_failures(str(tmp_path))
    assert (failure.rank, failure.kind, failure.error) == (3, "user", "ConfigError")
    assert failure.message == "seq_length: 7 is not a multiple of 8"
    assert "Traceback" in Path(failure.traceback_file).read_text()


def test_without_a_folder_the_worker_prints_one_line(tmp_path):
    proc = _worker(tmp_path, "user")
    assert proc.returncode == USER_ERROR_EXIT
    assert proc.stderr == "rank 3: seq_length: 7 is not a multiple of 8\n"
    verbose = _worker(tmp_path, "user", "--verbose")
    assert "Traceback" in verbose.stderr and verbose.stderr.endswith("multiple of 8\n")


def test_a_full_disk_is_its_message_alone_and_its_traceback_with_verbose(tmp_path):
    recorded = _worker(tmp_path, "disk", ERRORS_DIR_FLAG, str(tmp_path))
    assert recorded.returncode == USER_ERROR_EXIT and recorded.stderr == ""
    [failure] = read_failures(str(tmp_path))
    assert (failure.kind, failure.error) == ("user", "CheckpointSaveError")
    alone = _worker(tmp_path, "disk")
    assert alone.stderr.startswith("rank 3: could not save checkpoint /ckpt/global_step2 (")
    assert "Traceback" not in alone.stderr and alone.stderr.count("\n") == 1
    verbose = _worker(tmp_path, "disk", "--verbose")
    assert "Traceback" in verbose.stderr and "CheckpointSaveError: could not" in verbose.stderr


def test_a_bug_keeps_its_traceback_and_a_later_failure_is_collateral(tmp_path):
    first = _worker(tmp_path, "bug", ERRORS_DIR_FLAG, str(tmp_path), rank="0")
    assert first.returncode == 1
    assert "Traceback" in first.stderr and "RuntimeError: a bug" in first.stderr
    later = _worker(tmp_path, "bug", ERRORS_DIR_FLAG, str(tmp_path), rank="1")
    assert later.returncode == 1 and later.stderr == ""
    assert [(f.rank, f.kind) for f in read_failures(str(tmp_path))] == [
        (0, "bug"),
        (1, "collateral"),
    ]


def test_a_raise_in_a_command_line_tool_is_a_user_error():
    from tools.inspect_checkpoint import parse_resume_at

    with pytest.raises(ValueError, match="'tq=2' is not valid") as caught:
        parse_resume_at("tq=2")
    assert is_user_error(caught.value)
    assert not is_user_error(_raised("a, b = [1, 2, 3]", REPO / "tools" / "not_a_tool.py"))


def test_a_tool_ends_a_user_error_with_one_line_and_a_bug_with_its_traceback(capsys):
    def main(argv):
        if argv == ["user"]:
            raise ConfigError("seq_length: 7 is not a multiple of 8")
        if argv == ["bug"]:
            raise RuntimeError("a bug")
        return 0

    assert run_tool(main, []) == 0
    assert run_tool(main, ["user"]) == USER_ERROR_EXIT
    assert capsys.readouterr().err == "test_errors.py: seq_length: 7 is not a multiple of 8\n"
    assert run_tool(main, ["user"], status=1, label="error") == 1
    assert capsys.readouterr().err == "error: seq_length: 7 is not a multiple of 8\n"
    with pytest.raises(RuntimeError, match="a bug"):
        run_tool(main, ["bug"])
    assert capsys.readouterr().err == ""


def test_every_tool_reports_through_run_tool():
    for tool in sorted((REPO / "tools").glob("*.py")):
        text = tool.read_text()
        assert "sys.exit(run_tool(main" in text or "return run_tool(" in text, tool.name
