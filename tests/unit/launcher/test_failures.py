"""megatron/launcher/failures.py and the launch's errors folder: what deepy.py prints after a
failed launch, from the records the workers wrote, and where the workers are told to write.
A user error is its message alone: no traceback, no pointer to a folder of them (which is
removed), unless a bug is among the failures."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from megatron.launcher import prepare_launch, run_launch
from megatron.launcher.failures import (
    BUG,
    COLLATERAL,
    ERRORS_DIR_FLAG,
    LOST_PEER,
    USER,
    USER_ERROR_EXIT,
    Failure,
    errors_dir_from_argv,
    exit_status,
    failure_report,
    rank_ranges,
    read_failures,
    write_failure,
)


def record(folder: Path, rank: int, kind: str, message: str, error: str = "ConfigError"):
    trace = f"Traceback (most recent call last):\n  ...\n{error}: {message}\n"
    return write_failure(str(folder), Failure(rank, kind, error, message, ""), trace)


def test_rank_ranges():
    assert rank_ranges([2]) == "rank 2"
    assert rank_ranges([3, 0, 1, 2, 6]) == "ranks 0-3, 6"
    assert rank_ranges([None]) == "rank ?"


def test_each_user_error_is_reported_once_with_its_ranks(tmp_path):
    for rank in range(4):
        record(tmp_path, rank, USER, "data_path: no corpus.bin/.idx pair", "FileNotFoundError")
    record(tmp_path, 4, USER, "load: layer_00-model_00-model_states.pt is truncated")
    failures = read_failures(str(tmp_path))
    assert [f.rank for f in failures] == [0, 1, 2, 3, 4]
    assert failure_report(failures, str(tmp_path), verbose=False) == [
        "error on ranks 0-3: data_path: no corpus.bin/.idx pair",
        "error on rank 4: load: layer_00-model_00-model_states.pt is truncated",
    ]
    assert exit_status(failures, 2) == USER_ERROR_EXIT


def test_verbose_prints_one_traceback_per_message(tmp_path):
    for rank in range(2):
        record(tmp_path, rank, USER, "bad value")
    lines = failure_report(read_failures(str(tmp_path)), str(tmp_path), verbose=True)
    assert "\n".join(lines).count("Traceback") == 1
    assert lines[-1] == "error on ranks 0-1: bad value"


def test_a_lost_peer_beside_another_failure_is_collateral_whoever_wrote_first(tmp_path):
    from megatron.launcher.peers import LostPeerError

    assert LOST_PEER == LostPeerError.__name__
    record(tmp_path, 0, USER, "lost contact with another rank", LOST_PEER)  # before rank 1's
    record(tmp_path, 1, BUG, "boom", "RuntimeError")
    failures = read_failures(str(tmp_path))
    assert [(f.rank, f.kind) for f in failures] == [(0, COLLATERAL), (1, BUG)]
    assert exit_status(failures, 1) == 1
    assert exit_status(failures, USER_ERROR_EXIT) == 1  # the runner passed on rank 0's status
    assert failure_report(failures, str(tmp_path), verbose=False)[0] == (
        "rank 1 failed (traceback above)"
    )


def test_lost_peers_alone_are_the_message(tmp_path):
    for rank in range(2):
        record(tmp_path, rank, USER, "lost contact with rank 2 on node2 (10.0.0.2)", LOST_PEER)
    failures = read_failures(str(tmp_path))
    assert [f.kind for f in failures] == [USER, USER]
    assert exit_status(failures, 1) == USER_ERROR_EXIT


def test_a_bug_keeps_the_runner_status_and_collateral_ranks_are_one_line(tmp_path):
    record(tmp_path, 1, BUG, "boom", "RuntimeError")
    record(tmp_path, 0, COLLATERAL, "Connection closed by peer", "RuntimeError")
    record(tmp_path, 2, COLLATERAL, "Connection closed by peer", "RuntimeError")
    failures = read_failures(str(tmp_path))
    assert failure_report(failures, str(tmp_path), verbose=False) == [
        "rank 1 failed (traceback above)",
        "ranks 0, 2 stopped after that failure",
        f"tracebacks: {tmp_path} (or run again with --verbose)",
    ]
    assert exit_status(failures, 1) == 1


def launch(tmp_path: Path, launcher: dict):
    return prepare_launch(
        launcher,
        "train.py",
        ["--megatron_config", "abc"],
        environ={"PATH": "/bin"},
        launch_dir=str(tmp_path),
        device_count=0,
        collect_errors=True,
    )


def test_a_local_launch_gets_a_fresh_errors_folder_removed_when_empty(tmp_path):
    with launch(tmp_path, {"num_gpus": 2}) as plan, launch(tmp_path, {"num_gpus": 2}) as other:
        assert plan.errors_dir != other.errors_dir and os.path.isdir(plan.errors_dir)
        assert errors_dir_from_argv(plan.argv) == plan.errors_dir
        assert plan.argv[-2:] == [ERRORS_DIR_FLAG, plan.errors_dir]
        record(Path(other.errors_dir), 0, USER, "bad value")
    assert not os.path.exists(plan.errors_dir)
    assert read_failures(other.errors_dir)[0].message == "bad value"  # kept to be read


WORKER = """
import sys
from megatron.launcher.failures import Failure, write_failure
write_failure(sys.argv[1], Failure(0, sys.argv[2], "E", "disk full", ""), "Traceback ...")
sys.exit(2)
"""


def _run(tmp_path: Path, kind: str, capsys) -> tuple[int, str, str]:
    with launch(tmp_path, {"num_gpus": 1}) as plan:
        worker = [sys.executable, "-c", WORKER, plan.errors_dir, kind]
        status = run_launch(dataclasses.replace(plan, argv=worker, env=dict(os.environ)))
        return status, capsys.readouterr().err, plan.errors_dir


def test_a_launch_stopped_by_user_errors_says_the_message_and_keeps_no_tracebacks(tmp_path, capsys):
    status, err, folder = _run(tmp_path, USER, capsys)
    assert status == USER_ERROR_EXIT
    assert err == "deepy.py: error on rank 0: disk full\n"
    assert not os.path.exists(folder)
    status, err, folder = _run(tmp_path, BUG, capsys)
    assert status == 1 and f"deepy.py: tracebacks: {folder}" in err  # a bug is never 2
    assert read_failures(folder)[0].kind == BUG  # a bug's tracebacks are kept


def test_workers_print_their_errors_when_this_machine_cannot_see_their_files(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=1\nn2 slots=1\n")
    unshared = {"hostfile": str(hostfile), "launcher": "openmpi", "preflight_shared_fs": False}
    with launch(tmp_path, unshared) as plan:
        assert plan.errors_dir is None and ERRORS_DIR_FLAG not in plan.argv
    with launch(tmp_path, {**unshared, "preflight_shared_fs": True}) as plan:
        assert errors_dir_from_argv(plan.argv) == plan.errors_dir is not None
