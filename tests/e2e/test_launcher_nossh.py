"""Launching without ssh, end to end: two `deepy.py train.py` processes on this machine play two
nodes of 2 CPU ranks each (`no_ssh: true`, their place from the environment as a Kubernetes
pod's would be) and train one world of 4 that repeats a 4-rank local run's losses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed import free_port
from tests.tiny import tiny_settings, write_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 420
ITERS = 3
# Left out of the runs' environment: a CI job inside SLURM/MPI/Kubernetes must not steer them.
INHERITED = (
    "CUDA_VISIBLE_DEVICES", "SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "RANK", "LOCAL_RANK",
    "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "JOB_COMPLETION_INDEX",
)  # fmt: skip


def _config(folder: Path, **changes) -> Path:
    settings = tiny_settings(
        folder, train_iters=ITERS, eval_interval=100, save=None, load=None, **changes
    )
    return write_config(folder, settings)


def _deepy(config: Path, **environ: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED)}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **environ)
    return subprocess.Popen(
        [sys.executable, "deepy.py", "train.py", str(config)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    """Every process's output once all have exited (0 each), killing them all on a timeout."""
    deadline = time.monotonic() + TIMEOUT
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for other in procs:
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            pytest.fail(
                f"deepy did not finish within {TIMEOUT} s:\n{proc.communicate()[0][-3000:]}"
            )
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-4000:]
    return outputs


def _losses(folder: Path) -> dict[int, float]:
    lines = (folder / "logs" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return {r["iteration"]: r["loss"] for r in records if "split" not in r}


def test_two_no_ssh_nodes_repeat_a_four_rank_local_run(tmp_path):
    local_dir, nodes_dir = tmp_path / "local", tmp_path / "nodes"
    _finish([_deepy(_config(local_dir, num_gpus=4, master_port=free_port()))])
    local = _losses(local_dir)
    assert sorted(local) == list(range(1, ITERS + 1))

    config = _config(nodes_dir, num_gpus=2, no_ssh=True)  # master_port: from MASTER_PORT
    common = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    # Node 1 takes its rank the way a Kubernetes Indexed Job's pod does.
    node0 = _deepy(config, NODE_RANK="0", **common)
    node1 = _deepy(config, JOB_COMPLETION_INDEX="1", **common)
    out0, out1 = _finish([node0, node1])
    port = common["MASTER_PORT"]
    assert "ranks 0-1 of 4 (node 0 of 2 from NODE_RANK; master 127.0.0.1" in out0
    assert "ranks 2-3 of 4 (node 1 of 2 from JOB_COMPLETION_INDEX; master 127.0.0.1" in out1
    assert f"master port {port}" in out0 and f"master port {port}" in out1
    nodes = _losses(nodes_dir)
    assert sorted(nodes) == sorted(local)
    for iteration, loss in local.items():
        assert nodes[iteration] == pytest.approx(loss, abs=1e-6), iteration
