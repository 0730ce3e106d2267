"""Ctrl-C in the terminal of `deepy.py train.py` on two CPU ranks, sent as a terminal sends it
(SIGINT to the whole process group of the job, deepy.py started in a session of its own): each
rank finishes its step and saves, deepy.py says it is saving and which checkpoint it saved,
without a traceback, and exits 0; `latest` names that checkpoint, complete; no process of the
run is left; the same command resumes from it. (A second Ctrl-C, which kills the run at once,
is tested on a stand-in tree in tests/unit/launcher/test_runner_process.py: a real save is too
quick to be caught in the middle.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from megatron.checkpoint.folders import list_checkpoints, read_latest
from tests.distributed import free_port
from tests.processes import session_left
from tests.tiny import tiny_settings, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
SAVING = "deepy.py: interrupted: saving a checkpoint after this step, then stopping"
SAVED = re.compile(r"^deepy\.py: interrupted: saved (global_step\d+); the same command resumes")


class Console:
    """deepy.py's merged stdout and stderr, read as it comes."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not any(re.search(pattern, line) for line in self.lines):
            assert proc.poll() is None, "\n".join(self.lines[-40:])
            assert time.monotonic() < deadline, f"no {pattern!r} in {TIMEOUT} s"
            time.sleep(0.05)

    def text(self) -> str:
        self.reader.join(timeout=30)
        return "\n".join(self.lines)


def _start(config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "deepy.py", "train.py", str(config)],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a job of its own, as a terminal's shell starts it
    )


def _interrupt(proc: subprocess.Popen, console: Console) -> tuple[int, list[psutil.Process]]:
    """Ctrl-C once training runs; (deepy.py's exit status, the run's processes before)."""
    console.wait_for(r"iteration +3/", proc)
    run = psutil.Process(proc.pid).children(recursive=True)
    assert len(run) >= 4, run  # the runner, launch.py, two ranks
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    return proc.wait(timeout=TIMEOUT), run


def _start_records(folder: Path) -> list[dict]:
    lines = (folder / "logs" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("split") == "run"]


def test_ctrl_c_saves_on_every_rank_exits_cleanly_and_the_run_resumes(tmp_path):
    settings = dict(num_gpus=2, train_iters=2000, checkpoint_factor=None, eval_interval=10**6)
    config = write_config(tmp_path, tiny_settings(tmp_path, master_port=free_port(), **settings))
    proc = _start(config)
    try:
        console = Console(proc)
        status, run = _interrupt(proc, console)
        out = console.text()
        assert status == 0, out[-4000:]
        assert not session_left(proc.pid), out[-2000:]
        assert not [p for p in run if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        if session_left(proc.pid):  # only after a failed check: nothing of it may stay
            os.killpg(proc.pid, signal.SIGKILL)
    lines = out.splitlines()
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-4000:]
    assert "the run failed" not in out
    assert sum(line.startswith(SAVING) for line in lines) == 1, out[-4000:]
    saved = [m.group(1) for m in map(SAVED.match, lines) if m]
    assert len(saved) == 1 and lines[-1].startswith("deepy.py: interrupted: saved"), out[-4000:]
    tag = saved[0]
    step = int(tag.removeprefix("global_step"))
    assert 3 <= step < 2000 and f"saved checkpoint {tag}" in lines
    ckpt = tmp_path / "ckpt"
    assert read_latest(ckpt) == tag and (ckpt / tag / "complete").is_file()
    assert [it for it, _ in list_checkpoints(ckpt, complete_only=True)] == [step]

    resumed = subprocess.run(
        [sys.executable, "deepy.py", "train.py", str(config), "--set", f"exit_interval={step + 1}"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-4000:] + resumed.stdout[-4000:]
    start = _start_records(tmp_path)[-1]
    assert start["iteration"] == step and start["resumed_from"].endswith(tag)
    assert read_latest(ckpt) == f"global_step{step + 1}"
