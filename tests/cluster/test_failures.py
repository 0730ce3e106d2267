"""A cluster's bad days, on real daemons: preemption before a time limit, and a node that dies.

* Preemption: docs/training.md's self-requeueing batch script, stopped mid-run by
  `scancel --signal=TERM JOB.0` (what SLURM does at `--signal=TERM@SECONDS` before the time
  limit, and what a preemption sends): every rank finishes its step, saves one checkpoint and
  exits 0, with data-loader workers running (`num_workers: 2`), the script requeues the job,
  and the requeued job resumes from `latest` and finishes. Every logged loss equals the
  uninterrupted run's.
* A node dies: every process of node2 is killed (SIGKILL by PID) mid-run under pdsh. The rank
  on node1 stops within `distributed_timeout_minutes` (1) with a message naming the rank and
  node it lost, deepy.py exits non-zero, `latest` stays on the last complete checkpoint, and
  a relaunch on both nodes resumes from it exactly.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from megatron.checkpoint.folders import COMPLETE, read_latest
from tests.cluster.runs import (
    ITERS,
    REPO,
    RUN_ENV,
    deepy_argv,
    hostfile,
    losses,
    run_config,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TIMEOUT = 600
REVOKE_MARGIN = 3  # seconds after a requeue before the job may start again (see below)


def _records(folder: Path) -> list[tuple[int, float]]:
    """Every (iteration, loss) the runs logged, a resumed run's repeats included."""
    lines = (folder / "logs" / "metrics.jsonl").read_text().splitlines()
    records = map(json.loads, lines)
    return [(r["iteration"], r["loss"]) for r in records if "loss" in r and "split" not in r]


def _assert_every_loss_as_uninterrupted(folder: Path, reference: dict[int, float]) -> None:
    records = _records(folder)
    assert sorted({it for it, _ in records}) == list(range(1, ITERS + 1))
    for it, loss in records:
        assert loss == pytest.approx(reference[it], rel=1e-5, abs=1e-6), (it, loss)


def _latest_step(folder: Path) -> int:
    tag = read_latest(folder / "ckpt") or "global_step0"
    return int(tag.removeprefix("global_step"))


def _state(cluster, job: str) -> str:
    """The job's state and reason, e.g. "PENDING BeginTime" (a finished job stays listed for
    MinJobAge seconds); "" when unknown."""
    listed = cluster.run("node1", ["squeue", "-h", "-t", "all", "-j", job, "-o", "%T %r"])
    return listed.stdout.strip()


def _batch_step_running(cluster, job: str) -> bool:
    """Whether the batch script of `job` (its `slurmstepd: [JOB.batch]`) still runs on node1."""
    for pid in cluster.pids("node1"):
        try:
            if f"[{job}.batch]".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:  # gone meanwhile
            continue
    return False


def _finished_starting_it_now(cluster, job: str, requeued_at: float) -> bool:
    """Whether `job` completed. SLURM holds a requeued job back 120 s (BeginTime), which the
    test does not wait for: once the requeued script's old instance is gone, and a few seconds
    after the requeue, it moves the job's start to now. Not sooner: slurmd revoked the old
    instance's credential at the requeue, to the second, and refuses a credential made in that
    same second ("Job credential revoked"), which fails the job for good."""
    state = _state(cluster, job)
    settled = time.monotonic() - requeued_at > REVOKE_MARGIN
    if state == "PENDING BeginTime" and settled and not _batch_step_running(cluster, job):
        cluster.run("node1", ["scontrol", "update", f"JobId={job}", "StartTime=now"])
    return state.startswith("COMPLETED")


def _job_story(cluster, job: str, out: Path) -> str:
    """The job's state, SLURM's record of it and the end of its output, for a failure."""
    shown = cluster.run("node1", ["scontrol", "show", "job", job]).stdout
    text = out.read_text() if out.exists() else "(no output file)"
    logs = cluster._logs()[-6000:]
    return f"state: {_state(cluster, job)!r}\n{shown}\n--- {out}:\n{text[-6000:]}\n{logs}"


def test_a_preempted_job_saves_requeues_itself_and_resumes_exactly(cluster, reference, tmp_path):
    config = run_config(tmp_path, num_workers=2)
    deepy = deepy_argv(config, REPO / "configs" / "slurm.yml", "--set", "num_gpus=1")
    script = tmp_path / "job.sh"
    script.write_text(  # docs/training.md's recipe, with this run's paths
        "#!/bin/bash\n"
        "#SBATCH --nodes=2 --ntasks-per-node=1\n"
        "#SBATCH --signal=TERM@120 --requeue --open-mode=append\n"
        f"{subprocess.list2cmdline(deepy)}\n"
        f'[ "$(cat {tmp_path}/ckpt/latest)" = global_step{ITERS} ] '
        '|| scontrol requeue "$SLURM_JOB_ID"\n'
    )
    out = tmp_path / "job.out"
    submitted = cluster.run(
        "node1", ["sbatch", f"--output={out}", f"--chdir={tmp_path}", str(script)], env=RUN_ENV
    )
    job = submitted.stdout.split()[-1]
    wait_for(lambda: len(_safe_losses(tmp_path)) >= 3, TIMEOUT, "iteration 3")
    signalled = time.monotonic()
    cluster.run("node1", ["scancel", "--signal=TERM", f"{job}.0"])
    wait_for(lambda: _state(cluster, job).startswith("PENDING"), 120, "the job requeued")
    stopped_in = time.monotonic() - signalled
    saved = _latest_step(tmp_path)
    assert 3 <= saved < ITERS and stopped_in < 60, (saved, stopped_in)
    requeued_at = signalled + stopped_in
    wait_for(
        lambda: _finished_starting_it_now(cluster, job, requeued_at), TIMEOUT,
        "the requeued job's end", describe=lambda: _job_story(cluster, job, out),
    )  # fmt: skip
    text = out.read_text()
    assert f"stopped early at iteration {saved} of {ITERS}" in text
    assert f"starting at {saved}" in text and f"finished at iteration {ITERS}" in text
    assert "Traceback" not in text and "killed by signal" not in text
    assert _latest_step(tmp_path) == ITERS
    _assert_every_loss_as_uninterrupted(tmp_path, reference)


def _safe_losses(folder: Path) -> dict[int, float]:
    try:
        return losses(folder)
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or a line half way
        return {}


def test_a_dead_node_stops_the_run_naming_it_and_a_relaunch_resumes(cluster, reference, tmp_path):
    config = run_config(
        tmp_path, hostfile=hostfile(tmp_path, cluster), checkpoint_factor=4,
        distributed_timeout_minutes=1,
    )  # fmt: skip
    run = cluster.popen(
        "node1", deepy_argv(config), cwd=tmp_path, env=RUN_ENV,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    killed = False
    try:
        wait_for(lambda: _latest_step(tmp_path) >= 8, TIMEOUT, "the step-8 checkpoint", run)
        killed_at = time.monotonic()
        killed = cluster.kill_node("node2")
        assert killed
        out, _ = run.communicate(timeout=60 + 60)  # distributed_timeout_minutes, and a margin
    finally:
        if run.poll() is None:
            run.kill()
        if killed:  # whatever happens next: the tests after this one need both nodes
            cluster.revive("node2")
    assert run.returncode != 0 and time.monotonic() - killed_at < 60 + 30, out[-3000:]
    assert "lost contact with rank 1 on node2" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    latest = _latest_step(tmp_path)
    assert latest >= 8 and (tmp_path / "ckpt" / f"global_step{latest}" / COMPLETE).exists()
    again = cluster.run("node1", deepy_argv(config), cwd=tmp_path, env=RUN_ENV, timeout=TIMEOUT)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"starting at {latest}" in again.stdout
    _assert_every_loss_as_uninterrupted(tmp_path, reference)
