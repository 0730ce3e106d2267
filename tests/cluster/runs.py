"""The runs the cluster tests launch, and how their results are read.

One config for every launcher: the tiny character model of `tests/tiny.py`
without dropout, `ITERS` iterations, one CPU thread per rank (the nodes share this machine's
two cores). `reference` (conftest) trains it on 2 local ranks; every launch must repeat its
losses within 1e-5.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.tiny import tiny_settings, write_config

REPO = Path(__file__).resolve().parents[2]
ITERS = 40  # long enough for a signal to land mid-run
TIMEOUT = 600
RUN_ENV = {"OMP_NUM_THREADS": "1"}  # one thread per rank: the nodes share two cores


def rendezvous_port() -> int:
    """A free port below Linux's ephemeral range (32768-60999), where srun and slurmstepd
    open their own sockets inside a node: an ephemeral port free here may be theirs there."""
    for _ in range(100):
        port = random.randrange(20000, 32000)
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise RuntimeError("no free port in 20000-32000")


def run_config(folder: Path, **changes) -> Path:
    """Write the run's config under `folder` (checkpoints, logs and index cache there too)."""
    run = dict(
        hidden_dropout=0.0,
        attention_dropout=0.0,
        train_iters=ITERS,
        eval_interval=1000,
        master_port=rendezvous_port(),
    )
    return write_config(folder, tiny_settings(folder, **{**run, **changes}))


def deepy_argv(config: Path, *more, script: Path = REPO / "train.py") -> list[str]:
    """`python deepy.py SCRIPT CONFIG ...` with absolute paths (runs from any folder)."""
    return [sys.executable, str(REPO / "deepy.py"), str(script), str(config), *map(str, more)]


def hostfile(folder: Path, cluster) -> Path:
    """A DeepSpeed hostfile of the cluster's nodes, one slot (CPU rank) each."""
    path = folder / "hostfile"
    path.write_text("".join(f"{node} slots=1\n" for node in cluster.names))
    return path


def losses(folder: Path) -> dict[int, float]:
    """{iteration: training loss} from the run's metrics.jsonl (a resumed run appends; the
    evaluations' records, which name their `split`, are left out)."""
    lines = (folder / "logs" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return {r["iteration"]: r["loss"] for r in records if "loss" in r and "split" not in r}


def assert_same_losses(got: dict[int, float], expected: dict[int, float]) -> None:
    assert sorted(got) == sorted(expected) == list(range(1, ITERS + 1)), (got, expected)
    for it in expected:
        assert got[it] == pytest.approx(expected[it], rel=1e-5, abs=1e-6), (it, got, expected)


@dataclass
class Job:
    returncode: int
    output: str


def sbatch_wait(cluster, folder: Path, command: list[str], *options: str) -> Job:
    """Run `command` as a 2-node batch job from `folder` and wait for it to end."""
    out = folder / "job.out"
    script = folder / "job.sh"
    script.write_text("#!/bin/bash\n" + subprocess.list2cmdline(command) + "\n")
    done = cluster.run(
        "node1",
        ["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=1", f"--output={out}",
         f"--chdir={folder}", *options, str(script)],
        timeout=TIMEOUT,
        env=RUN_ENV,
    )  # fmt: skip
    text = out.read_text() if out.exists() else ""
    return Job(done.returncode, f"{done.stdout}{done.stderr}\n{text}")


def wait_for(ready, timeout: float, what: str, proc=None, describe=None) -> None:
    """Poll `ready` until true; fail past `timeout`, saying what `describe()` sees then."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended before {what}")
        if time.monotonic() > deadline:
            seen = f"\n{describe()}" if describe is not None else ""
            pytest.fail(f"no {what} within {timeout:.0f} s{seen}")
        time.sleep(0.1)
