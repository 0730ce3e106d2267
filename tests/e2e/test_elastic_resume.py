"""Elastic resume through `deepy.py` (issue 16): a 2-rank data-parallel ZeRO-1 run is killed
(SIGKILL, whole process group) after its step-3 checkpoint; resumed from its `latest` at 1
rank and at 4 ranks (tp2 x dp2) with the same config otherwise, the pre-flight refuses each
before launch and names the `tools/reshard.py` command. The test runs that command as a user
would (filling in the output folder) and loads the result at the ZeRO stage the refusal names
(the config's own stage 1 here, through DeepSpeed's universal-checkpoint loader); each run
continues after step 3 with the converted optimizer state and finishes, and the two agree at
the same global batch.

Vocabulary padding (issue item 6): with `make_vocab_size_divisible_by: 40` the character
vocabulary (512) is padded to 520 rows at tp 1 and to 560 at tp 2. A finished dp-2 ZeRO-1 run
resumed from its step-3 checkpoint at tp 2, after the reshard command the refusal prints
(which keeps the 520 rows), repeats the finished run's losses of steps 4-6 within 1e-5: the
padding logits take no part in the loss.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron.checkpoint.folders import read_latest, write_latest
from tests.distributed import free_port
from tests.tiny import tiny_settings, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300
# The stopped run saves only at step 3 (extra_save_iters) and would go on to 12.
RUN = dict(
    hidden_dropout=0.0,
    attention_dropout=0.0,
    train_iters=12,
    eval_interval=1000,
    checkpoint_factor=None,
    extra_save_iters=[3],
    zero_optimization={"stage": 1},
)
COMMAND = re.compile(
    r"python (tools/reshard\.py --checkpoint \S+ --output <new folder> [^\n]*?) and load the "
    r"new folder with zero_optimization stage (\d)"
)


def _config(folder: Path, port: int, **changes) -> Path:
    return write_config(folder, tiny_settings(folder, master_port=port, **{**RUN, **changes}))


def _popen(config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "deepy.py", "train.py", str(config)],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, which the test may kill whole
    )


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"deepy did not finish within {TIMEOUT} s:\n{out[-4000:]}")
    return proc.returncode, out


def _drop_shm_buffers(port: int) -> None:
    """DeepSpeed's CPU shared-memory all-reduce buffers (tens of MB per rank, named after the
    run's master port) outlive a killed run, and a finished one too."""
    for path in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"):
        path.unlink(missing_ok=True)


def _deepy(folder: Path, **changes) -> tuple[int, str]:
    port = free_port()
    try:
        return _finish(_popen(_config(folder, port, **changes)))
    finally:
        _drop_shm_buffers(port)


def _kill_after_step3(folder: Path) -> None:
    port = free_port()
    proc = _popen(_config(folder, port, num_gpus=2))
    deadline = time.monotonic() + TIMEOUT
    try:
        while read_latest(folder / "ckpt") is None:
            if proc.poll() is not None:
                pytest.fail(f"the run ended before its step-3 save:\n{proc.stdout.read()[-4000:]}")
            assert time.monotonic() < deadline, "no step-3 checkpoint in time"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    finally:
        _drop_shm_buffers(port)
    assert proc.returncode == -signal.SIGKILL  # killed, not finished
    assert read_latest(folder / "ckpt") == "global_step3"


def _losses(folder: Path) -> dict[int, float]:
    lines = (folder / "logs" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return {r["iteration"]: r["loss"] for r in records if "split" not in r and "loss" in r}


def _resume_as_a_user(folder: Path, killed: Path, **layout) -> tuple[int, str]:
    """Resume `killed` at `layout`; when the pre-flight refuses and names the reshard command
    and ZeRO stage, run that command into `folder`/ckpt and resume from there at that stage.
    Returns (the stage, the resumed run's output)."""
    code, out = _deepy(folder, load=str(killed), **layout)
    assert code == 2, out[-4000:]  # refused before launch
    assert "launching" not in out and not (folder / "logs").exists()
    found = COMMAND.search(" ".join(out.split()))
    assert found, out[-4000:]
    command, stage = found.group(1), int(found.group(2))
    argv = shlex.split(command.replace("<new folder>", str(folder / "ckpt")))
    done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "optimizer state: converted from ZeRO stage 1" in done.stdout, done.stdout
    code, out = _deepy(folder, **{**layout, "zero_optimization": {"stage": stage}})
    assert code == 0, out[-4000:]
    return stage, out


def test_a_run_killed_at_2_ranks_resumes_at_1_and_4_ranks(tmp_path):
    killed = tmp_path / "killed"
    _kill_after_step3(killed)
    losses = {}
    # Global batch 8 at each layout, as in the killed run (micro batch 2).
    for ranks, tp, accumulation in ((1, 1, 4), (4, 2, 2)):
        folder = tmp_path / f"ranks{ranks}"
        layout = dict(num_gpus=ranks, model_parallel_size=tp)
        stage, out = _resume_as_a_user(
            folder, killed / "ckpt", gradient_accumulation_steps=accumulation, **layout
        )
        world = f"world {ranks} = data {ranks // tp} × pipeline 1 (pipeline engine) × tensor {tp}"
        assert f"{world}; ZeRO stage {stage}" in out, out[-3000:]
        assert "layout changed from (tp,pp,dp)=(1,1,2)" in out, out[-3000:]
        losses[ranks] = _losses(folder)
        assert sorted(losses[ranks]) == list(range(4, 13)), ranks  # continued after step 3
        assert read_latest(folder / "ckpt") == "global_step12"
    # The same converted state and batches at two layouts: the same run (fp32, dropout 0).
    assert list(losses[4].values()) == pytest.approx(list(losses[1].values()), rel=1e-5)


def test_a_resume_at_tp2_repeats_the_losses_whatever_the_vocabulary_padding(tmp_path):
    padding = dict(make_vocab_size_divisible_by=40, train_iters=6)  # 520 rows at tp 1
    finished = tmp_path / "finished"
    code, out = _deepy(finished, num_gpus=2, **padding)  # dp 2, ZeRO 1, saves at 3 and 6
    assert code == 0, out[-4000:]
    write_latest(finished / "ckpt", "global_step3")  # resume where a run stopped at 3 would
    folder = tmp_path / "tp2"
    layout = dict(num_gpus=2, model_parallel_size=2, gradient_accumulation_steps=4, **padding)
    stage, out = _resume_as_a_user(folder, finished / "ckpt", **layout)
    expected, resumed = _losses(finished), _losses(folder)
    assert sorted(resumed) == [4, 5, 6], out[-3000:]
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(expected[step], rel=1e-5), step
    saved = json.loads((folder / "ckpt" / "global_step6" / "config.json").read_text())
    assert (saved["model_parallel_size"], saved["padded_vocab_size"]) == (2, 520)  # kept
