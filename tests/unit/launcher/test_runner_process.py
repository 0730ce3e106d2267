"""deepy.py's wait for the runner: remote launch.py INFO lines dropped, SIGTERM passed on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from megatron.launcher.runner_process import run_runner

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
