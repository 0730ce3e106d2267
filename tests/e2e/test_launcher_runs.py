"""End to end: the DeepSpeed runner really starts 2 CPU ranks that join a gloo group.

Three launches of the same tiny worker (setup_distributed_env + init_distributed + a gloo
all_reduce): local (DeepSpeed's launch.py), SLURM (a fake `srun` on PATH) and OpenMPI (a
fake `mpirun`). The fakes in fake_bin/ record their command line and run the tasks on this
machine with the environment a real scheduler would give them. A fake WANDB_API_KEY must
reach every rank, and never appear on a recorded command line or in the runner's output.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from megatron.launcher import SECRETS_FILE_VAR, prepare_launch
from tests.distributed import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FAKE_BIN = Path(__file__).resolve().parent / "fake_bin"
SECRET = "e2e-secret-7d1f0c5a9b"
# Left out of the test's environment: a CI job inside SLURM/MPI must not steer these runs.
INHERITED = (
    "CUDA_VISIBLE_DEVICES", "SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "RANK", "LOCAL_RANK",
    "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ENV_FILE",
)  # fmt: skip

WORKER = """
import base64, hashlib, json, os, sys

import torch
import torch.distributed as dist

from megatron.launcher import init_distributed, setup_distributed_env

settings = json.loads(base64.b64decode(sys.argv[sys.argv.index("--settings") + 1]))
out_dir = sys.argv[sys.argv.index("--out") + 1]
env = setup_distributed_env(settings)
backend = init_distributed("nccl")  # GPT-NeoX default; falls back to gloo without CUDA
assert init_distributed() == backend  # idempotent
total = torch.tensor([float(env.rank + 1)])
dist.all_reduce(total)
secret = os.environ.get("WANDB_API_KEY", "")
result = {
    "rank": env.rank,
    "local_rank": env.local_rank,
    "world_size": env.world_size,
    "master_addr": env.master_addr,
    "master_port": env.master_port,
    "backend": backend,
    "sum": total.item(),
    "dist_rank": dist.get_rank(),
    "secret_sha": hashlib.sha256(secret.encode()).hexdigest(),
    "argv": sys.argv[1:],
}
with open(os.path.join(out_dir, f"rank{env.rank}.json"), "w") as handle:
    json.dump(result, handle)
dist.destroy_process_group()
"""


def launch(tmp_path: Path, settings: dict) -> tuple[list[dict], str, list[dict], list[str]]:
    """Run the worker through prepare_launch; return per-rank results, output, fake calls."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    log = tmp_path / "launcher_calls.jsonl"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED)}
    environ.update(
        PATH=f"{FAKE_BIN}{os.pathsep}{environ['PATH']}",
        PYTHONPATH=str(REPO),
        WANDB_API_KEY=SECRET,
        FAKE_LAUNCHER_LOG=str(log),
        OMP_NUM_THREADS="1",
    )
    encoded = base64.b64encode(json.dumps(settings).encode()).decode()
    user_args = ["--settings", encoded, "--out", str(out_dir)]
    with prepare_launch(
        settings, str(worker), user_args, environ=environ, secrets_dir=str(tmp_path / "s")
    ) as plan:
        assert plan.world_size == 2
        display = plan.display()
        proc = subprocess.run(
            plan.argv, env=plan.env, cwd=tmp_path, capture_output=True, text=True, timeout=240
        )
        secrets_file = plan.secrets_file
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert secrets_file is None or not os.path.exists(secrets_file)  # cleaned up
    results = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(2)]
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    assert SECRET not in display and SECRET not in output
    for call in calls:
        assert not any(SECRET in arg for arg in call["argv"]), call
    return results, output, calls, plan.argv


def check_ranks(results: list[dict], port: int, master_addr: str) -> None:
    want_sha = hashlib.sha256(SECRET.encode()).hexdigest()
    for rank, result in enumerate(results):
        assert (result["rank"], result["dist_rank"], result["world_size"]) == (rank, rank, 2)
        assert result["local_rank"] == rank and result["backend"] == "gloo"
        assert result["sum"] == 3.0  # 1 + 2 from the all_reduce
        assert (result["master_addr"], result["master_port"]) == (master_addr, port)
        assert result["secret_sha"] == want_sha, "WANDB_API_KEY did not reach the rank"


def test_local_launch_runs_two_cpu_ranks(tmp_path):
    port = free_port()
    results, output, calls, argv = launch(tmp_path, {"num_gpus": 2, "master_port": port})
    check_ranks(results, port, "127.0.0.1")
    assert calls == []  # no srun/mpirun/ssh: DeepSpeed's local launch.py
    assert "deepspeed.launcher.launch" in output


def test_slurm_launch_through_srun(tmp_path):
    port = free_port()
    settings = {
        "launcher": "slurm",
        "deepspeed_slurm": True,
        "num_gpus": 2,
        "master_port": port,
        "comment": "e2e run",
    }
    results, _output, calls, _argv = launch(tmp_path, settings)
    check_ranks(results, port, "localhost")  # first node of SLURM_JOB_NODELIST
    (srun,) = [c["argv"] for c in calls if c["tool"] == "srun"]
    assert srun[:3] == ["-n", "2", "--comment=e2e run"]
    export = next(a for a in srun if a.startswith("--export="))
    assert export.startswith("--export=ALL") and "WANDB" not in export
    assert srun[-2:] == ["--out", str(tmp_path / "out")]


def test_openmpi_launch_through_mpirun(tmp_path):
    port = free_port()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    settings = {
        "launcher": "openmpi",
        "deepspeed_mpi": True,
        "hostfile": str(hostfile),
        "master_port": port,
    }
    results, _output, calls, _argv = launch(tmp_path, settings)
    check_ranks(results, port, "localhost")  # MASTER_ADDR exported with -x
    assert [c["argv"][-1] for c in calls if c["tool"] == "ssh"] == ["hostname"]  # ssh check
    (mpirun,) = [c["argv"] for c in calls if c["tool"] == "mpirun"]
    assert mpirun[:4] == ["-n", "2", "-hostfile", str(hostfile)]
    assert ["-x", SECRETS_FILE_VAR] == mpirun[mpirun.index(SECRETS_FILE_VAR) - 1 :][:2]
    assert f"MASTER_PORT={port}" in mpirun
