"""`deepy.py train.py` launched as users launch it on a cluster, on real daemons.

Two nodes (`cluster.py`), one CPU rank each, gloo, the tiny character model: pdsh over ssh
with a hostfile (DeepSpeed's default multi-node path), `launcher: slurm` inside an `sbatch`
allocation (`configs/slurm.yml`), one `deepy.py` per node under `srun` (`no_ssh`), and
OpenMPI's `mpirun`. Each run's losses equal those of the same config on 2 local ranks
within 1e-5, and what docs/training.md says reaches the remote ranks does. Preemption and a node
that dies are in `test_failures.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.cluster.runs import (
    REPO,
    RUN_ENV,
    assert_same_losses,
    deepy_argv,
    hostfile,
    losses,
    run_config,
    sbatch_wait,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
SECRET = "cluster-secret-4e1f8a"


def _leftovers(folder: Path) -> list[str]:
    launch = folder / ".megatron_launch"
    return sorted(p.name for p in launch.iterdir()) if launch.is_dir() else []


def test_pdsh_ranks_get_the_carried_environment_and_the_secret(cluster, tmp_path):
    config = run_config(tmp_path, hostfile=hostfile(tmp_path, cluster))
    env = {**RUN_ENV, "WANDB_API_KEY": SECRET}
    argv = deepy_argv(config, script=REPO / "tests" / "cluster" / "env_probe.py")
    done = cluster.run("node1", argv, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads((tmp_path / "ckpt" / f"probe-rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["host"] for r in records] == ["node1", "node2"]
    remote = records[1]
    assert remote["carried"]["PATH"] == cluster.env["PATH"]  # not a remote shell's own
    assert remote["carried"]["OMP_NUM_THREADS"] == "1"
    assert remote["carried"]["VIRTUAL_ENV"] == os.environ.get("VIRTUAL_ENV")
    assert remote["secret_sha"] == hashlib.sha256(SECRET.encode()).hexdigest()
    console = done.stdout + done.stderr
    assert SECRET not in console and "[INFO] [launch.py" not in console
    assert _leftovers(tmp_path) == []


def test_pdsh_over_ssh_with_a_hostfile(cluster, reference, tmp_path):
    config = run_config(tmp_path, hostfile=hostfile(tmp_path, cluster))
    done = cluster.run("node1", deepy_argv(config), cwd=tmp_path, env=RUN_ENV, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "node2: " in done.stdout  # the remote rank's lines, as pdsh prefixes them
    assert "--megatron_config" not in done.stdout + done.stderr  # no remote INFO lines
    assert_same_losses(losses(tmp_path), reference)


def test_slurm_launcher_inside_an_sbatch_allocation(cluster, reference, tmp_path):
    config = run_config(tmp_path)
    command = deepy_argv(config, REPO / "configs" / "slurm.yml", "--set", "num_gpus=1")
    job = sbatch_wait(cluster, tmp_path, command)
    assert job.returncode == 0, job.output
    assert_same_losses(losses(tmp_path), reference)
    assert _leftovers(tmp_path) == []


def test_one_deepy_per_node_under_srun_without_ssh(cluster, reference, tmp_path):
    config = run_config(tmp_path, no_ssh=True, num_gpus=1)
    job = sbatch_wait(cluster, tmp_path, ["srun", "--ntasks-per-node=1", *deepy_argv(config)])
    assert job.returncode == 0, job.output
    assert "node 1 of 2 from the SLURM step" in job.output
    assert_same_losses(losses(tmp_path), reference)


def test_openmpi_mpirun_with_a_hostfile(cluster, reference, tmp_path):
    config = run_config(
        tmp_path, hostfile=hostfile(tmp_path, cluster), launcher="openmpi", deepspeed_mpi=True
    )
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # as root
    done = cluster.run(
        "node1", deepy_argv(config), cwd=tmp_path, env={**RUN_ENV, **root}, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert_same_losses(losses(tmp_path), reference)
