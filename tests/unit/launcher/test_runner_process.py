"""deepy.py's wait for the runner: remote launch.py INFO lines dropped, SIGTERM passed on; a local
launch stopped by Ctrl-C (its ranks told by SIGTERM, the rest never seeing it), twice (all killed),
before its ranks exist, and by a SIGTERM to deepy.py, leaving no process behind (`fake_run.py`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from megatron.launcher.runner_process import run_runner
from megatron.launcher.stopping import RUNNER_BLOCKED
from tests.processes import session_left

REPO = Path(__file__).resolve().parents[3]
# What pdsh prints of a node's DeepSpeed launch.py at INFO (its output, prefixed by the node).
REMOTE_INFO = (
    "node2: [2026-11-24 22:56:01,113] [INFO] [launch.py:163:main] dist_world_size=2\n"
    "node1: [2026-11-24 22:56:01,120] [INFO] [launch.py:256:main] process 6556 spawned with "
    "command: ['/venv/bin/python', '-u', 'train.py', '--megatron_config', 'eyJhY2Nv...']\n"
)
KEPT = "node1: iteration 1/6 | loss 6.2843\nnode2: [2026-11-24 22:56:05] [WARNING] [real_acc...]\n"


def _printer(text_out: str, text_err: str) -> list[str]:
    code = f"import sys; sys.stdout.write({text_out!r}); sys.stderr.write({text_err!r})"
    return [sys.executable, "-c", code]


def test_remote_launcher_info_lines_are_dropped_and_the_rest_kept(capfd):
    status = run_runner(_printer(REMOTE_INFO + KEPT, "node2: error line\n"), dict(os.environ),
                        quiet_remote=True)  # fmt: skip
    out, err = capfd.readouterr()
    assert status == 0 and out == KEPT and err == "node2: error line\n"


def test_verbose_keeps_every_line(capfd):
    run_runner(_printer(REMOTE_INFO, ""), dict(os.environ), quiet_remote=False)
    assert capfd.readouterr().out == REMOTE_INFO


WAITER = """
import signal, sys, time
from megatron.launcher.runner_process import run_runner
from megatron.launcher.stopping import RUNNER_BLOCKED
from tests.processes import session_left

runner = [sys.executable, "-c", '''
import pathlib, signal, sys, time
def stop(*_):
    time.sleep(1.0)  # a rank saving its checkpoint
    pathlib.Path(sys.argv[1]).write_text("saved")
    sys.exit(7)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[1] + ".ready").write_text("")
time.sleep(60)
''', sys.argv[1]]
status = run_runner(runner, None)
print(f"runner status {status}", flush=True)
"""


def test_a_sigterm_is_passed_on_and_deepy_waits_for_the_runner(tmp_path):
    marker = tmp_path / "saved"
    script = tmp_path / "waiter.py"
    script.write_text(textwrap.dedent(WAITER))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(marker)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not Path(f"{marker}.ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the runner did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    # the runner got the signal, finished its work, and deepy.py outlived it
    assert marker.read_text() == "saved" and "runner status 7" in out
    assert proc.returncode == 0


FAKE_RUN = Path(__file__).with_name("fake_run.py")


def _fake_deepy(folder: Path, **env: str) -> subprocess.Popen:
    """`run_local_runner` over the fake tree, in a session of its own as a terminal's job."""
    return subprocess.Popen(
        [sys.executable, str(FAKE_RUN), "deepy", str(folder)],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _wait_for(folder: Path, pattern: str, count: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while len(list(folder.glob(pattern))) < count:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"no {count} x {pattern} in {folder}"
        time.sleep(0.02)


def _ctrl_c(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole foreground group


def _finish(proc: subprocess.Popen) -> str:
    try:
        out, _ = proc.communicate(timeout=60)
        left = session_left(proc.pid)
        assert not left, f"left behind: {left}"
        return out
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_ctrl_c_reaches_the_ranks_only_as_sigterm_and_the_run_ends_whole(tmp_path):
    proc = _fake_deepy(tmp_path, SAVE_S="1.0")
    _wait_for(tmp_path, "loader.*", 2, proc)
    _ctrl_c(proc)
    out = _finish(proc)
    # the runner and launch.py never saw the SIGINT: no traceback, no rank terminated early
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert out.splitlines() == ["announced requested SIGINT", "ended status 0 stop requested"]
    for n in range(2):  # each rank told once, saved, and its loader worker gone with it
        assert (tmp_path / f"rank{n}.sigterm").read_text() == "x"
        assert (tmp_path / f"rank{n}.saved").is_file()


def test_a_second_ctrl_c_kills_every_process_of_the_run_at_once(tmp_path):
    proc = _fake_deepy(tmp_path, SAVE_S="60")
    _wait_for(tmp_path, "loader.*", 2, proc)
    _ctrl_c(proc)
    _wait_for(tmp_path, "rank*.sigterm", 2, proc)  # the ranks are "saving"
    started = time.monotonic()
    _ctrl_c(proc)
    out = _finish(proc)  # the loader workers too, which ignore SIGTERM and outlive their rank
    assert time.monotonic() - started < 10
    assert out.splitlines() == [
        "announced requested SIGINT",
        "announced forced SIGINT",
        f"ended status {-signal.SIGKILL} stop forced",
    ]
    assert not list(tmp_path.glob("rank*.saved"))


def test_ranks_that_start_after_the_ctrl_c_are_stopped_too(tmp_path):
    proc = _fake_deepy(tmp_path, RUNNER_DELAY_S="1.5")
    _wait_for(tmp_path, "runner.*", 1, proc)  # no launch.py, no rank yet
    _ctrl_c(proc)
    out = _finish(proc)  # they would train on: none told, the wait would not end
    assert out.splitlines()[0] == "announced requested SIGINT"
    # each saved or, told while Python was starting, died of it (and launch.py stopped the
    # other): a rank in its start-up has nothing to save
    assert re.fullmatch(r"ended status (0|1) stop requested", out.splitlines()[-1]), out


def test_a_sigterm_to_deepy_stops_the_ranks_as_a_ctrl_c_does(tmp_path):
    proc = _fake_deepy(tmp_path)
    _wait_for(tmp_path, "loader.*", 2, proc)
    proc.send_signal(signal.SIGTERM)  # `kill PID`: deepy.py alone
    out = _finish(proc)
    assert out.splitlines() == ["announced requested SIGTERM", "ended status 0 stop requested"]
    assert len(list(tmp_path.glob("rank*.saved"))) == 2


def test_a_sigterm_to_the_whole_process_group_waits_for_the_ranks_save(tmp_path):
    # `timeout`, `kill -- -PGID`, a scheduler stopping every process: launch.py, left to act,
    # would kill the ranks KILL_WAIT_S after its own SIGTERM, in the middle of their save
    proc = _fake_deepy(tmp_path, SAVE_S="2", KILL_WAIT_S="0.5")
    _wait_for(tmp_path, "loader.*", 2, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    out = _finish(proc)
    assert out.splitlines() == ["announced requested SIGTERM", "ended status 0 stop requested"]
    assert len(list(tmp_path.glob("rank*.saved"))) == 2


BLOCKED = "sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM})"
MASK = [sys.executable, "-c", f"import signal; print(len({BLOCKED}), flush=True)"]
RANK = [sys.executable, "-c", "import signal; from megatron.errors import run_worker; "
        f"run_worker(lambda argv: print([s.name for s in {BLOCKED}], flush=True))"]  # fmt: skip


def test_the_runner_inherits_the_stops_blocked_only_where_deepy_handles_them(capfd):
    from megatron.launcher.runner_process import run_local_runner

    assert run_local_runner(MASK, None, print).status == 0  # the main thread: handled
    outside = threading.Thread(target=run_local_runner, args=(MASK, None, print))
    outside.start()  # no handler can be set there: a Ctrl-C stays the runner's own
    outside.join(timeout=60)
    assert capfd.readouterr().out.split() == ["2", "0"]
    assert not RUNNER_BLOCKED & signal.pthread_sigmask(signal.SIG_BLOCK, [])  # restored


def test_a_worker_takes_sigterm_back_and_leaves_sigint_blocked(capfd):
    from megatron.launcher.runner_process import run_local_runner

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    assert run_local_runner(RANK, env, print).status == 0
    assert capfd.readouterr().out.split() == ["['SIGINT']"]
