"""End to end: the DeepSpeed runner really starts 2 CPU ranks that join a gloo group.

Four launches of the same tiny worker (setup_distributed_env + init_distributed + a gloo
all_reduce): local (DeepSpeed's launch.py), SLURM (a fake `srun` on PATH), OpenMPI (a fake
`mpirun`) and pdsh on two "nodes" (a fake `pdsh`). The fakes in fake_bin/ record their
command line and run the tasks on this machine with the environment a real scheduler or
remote shell would give them. A fake WANDB_API_KEY must
reach every rank, and never appear on a recorded command line or in the runner's output.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from megatron.launcher import SECRETS_FILE_VAR, LaunchPlan, prepare_launch
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


@dataclass
class Launch:
    """One launch of the worker: its plan, process and (after `finish`) what it left."""

    settings: dict
    directory: Path
    plan: LaunchPlan
    proc: subprocess.Popen
    display: str
    output: str = ""
    results: list = field(default_factory=list)
    calls: list = field(default_factory=list)

    def finish(self, deadline: float) -> None:
        try:
            self.output, _ = self.proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.output = self.proc.communicate()[0] + "\n[killed: launch timed out]"
        out_dir = self.directory / "out"
        self.results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank*.json"))]
        log = self.directory / "launcher_calls.jsonl"
        if log.exists():
            self.calls = [json.loads(line) for line in log.read_text().splitlines()]

    def check_clean(self) -> None:
        """Exit status 0, files removed, and the secret nowhere on a command line or log."""
        assert self.proc.returncode == 0, self.output[-4000:]
        assert self.plan.secrets_file is None or not os.path.exists(self.plan.secrets_file)
        assert SECRET not in self.display and SECRET not in self.output
        for call in self.calls:
            assert not any(SECRET in arg for arg in call["argv"]), call


def start(directory: Path, settings: dict, stack: ExitStack) -> Launch:
    """Start the worker through prepare_launch (kept open on `stack`) without waiting."""
    worker = directory / "worker.py"
    worker.write_text(WORKER)
    (directory / "out").mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED)}
    environ.update(
        PATH=f"{FAKE_BIN}{os.pathsep}{environ['PATH']}",
        PYTHONPATH=str(REPO),
        WANDB_API_KEY=SECRET,
        FAKE_LAUNCHER_LOG=str(directory / "launcher_calls.jsonl"),
        OMP_NUM_THREADS="1",
    )
    encoded = base64.b64encode(json.dumps(settings).encode()).decode()
    user_args = ["--settings", encoded, "--out", str(directory / "out")]
    # Verbose: the runner's INFO lines print the worker commands, which must hold no secret.
    plan = stack.enter_context(
        prepare_launch(
            settings,
            str(worker),
            user_args,
            environ=environ,
            launch_dir=str(directory / "s"),
            verbose=True,
        )
    )
    assert plan.world_size == 2
    proc = subprocess.Popen(
        plan.argv,
        env=plan.env,
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Launch(settings, directory, plan, proc, plan.display())


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> dict[str, Launch]:
    """All four launches, run at the same time (they mostly wait on imports and polling)."""
    root = tmp_path_factory.mktemp("launches")
    hostfiles = {"openmpi": "localhost slots=2\n", "pdsh": "localhost slots=1\n127.0.0.1 slots=1\n"}
    for name, text in hostfiles.items():
        (root / f"{name}.hosts").write_text(text)
    settings = {
        "local": {"num_gpus": 2},
        "slurm": {
            "launcher": "slurm",
            "deepspeed_slurm": True,
            "num_gpus": 2,
            "comment": "e2e run",
        },
        "openmpi": {
            "launcher": "openmpi",
            "deepspeed_mpi": True,
            "hostfile": str(root / "openmpi.hosts"),
        },
        # Two "nodes" with one rank each; master_addr spares the runner an `ssh hostname -I`.
        "pdsh": {"hostfile": str(root / "pdsh.hosts"), "master_addr": "127.0.0.1"},
    }
    with ExitStack() as stack:
        running = {}
        for name, values in settings.items():
            directory = root / name
            directory.mkdir()
            running[name] = start(directory, {**values, "master_port": free_port()}, stack)
        deadline = time.monotonic() + 300
        for launch in running.values():
            launch.finish(deadline)
    return running  # the ExitStack has removed every staged secrets file by now


def check_ranks(
    results: list[dict], port: int, master_addr: str, local_ranks: tuple = (0, 1)
) -> None:
    want_sha = hashlib.sha256(SECRET.encode()).hexdigest()
    assert len(results) == 2
    for rank, result in enumerate(results):
        assert (result["rank"], result["dist_rank"], result["world_size"]) == (rank, rank, 2)
        assert result["local_rank"] == local_ranks[rank] and result["backend"] == "gloo"
        assert result["sum"] == 3.0  # 1 + 2 from the all_reduce
        assert (result["master_addr"], result["master_port"]) == (master_addr, port)
        assert result["secret_sha"] == want_sha, "WANDB_API_KEY did not reach the rank"


def test_local_launch_runs_two_cpu_ranks(launches):
    launch = launches["local"]
    launch.check_clean()
    check_ranks(launch.results, launch.settings["master_port"], "127.0.0.1")
    assert launch.calls == []  # no srun/mpirun/ssh: DeepSpeed's local launch.py
    assert "deepspeed.launcher.launch" in launch.output


def test_slurm_launch_through_srun(launches):
    launch = launches["slurm"]
    launch.check_clean()
    check_ranks(launch.results, launch.settings["master_port"], "localhost")  # first node
    (srun,) = [c["argv"] for c in launch.calls if c["tool"] == "srun"]
    assert srun[:3] == ["-n", "2", "--comment=e2e run"]
    export = next(a for a in srun if a.startswith("--export="))
    assert export.startswith("--export=ALL") and "WANDB" not in export
    assert srun[-3:] == ["--out", str(launch.directory / "out"), "--verbose"]


def test_openmpi_launch_through_mpirun(launches):
    launch = launches["openmpi"]
    launch.check_clean()
    port = launch.settings["master_port"]
    check_ranks(launch.results, port, "localhost")  # MASTER_ADDR exported with -x
    # DeepSpeed's passwordless-ssh check ran against the first host (through the fake ssh).
    assert [c["argv"][-1] for c in launch.calls if c["tool"] == "ssh"] == ["hostname"]
    (mpirun,) = [c["argv"] for c in launch.calls if c["tool"] == "mpirun"]
    assert mpirun[:4] == ["-n", "2", "-hostfile", launch.settings["hostfile"]]
    assert ["-x", SECRETS_FILE_VAR] == mpirun[mpirun.index(SECRETS_FILE_VAR) - 1 :][:2]
    assert f"MASTER_PORT={port}" in mpirun


def test_pdsh_launch_on_two_nodes(launches):
    launch = launches["pdsh"]
    launch.check_clean()
    check_ranks(launch.results, launch.settings["master_port"], "127.0.0.1", local_ranks=(0, 0))
    (pdsh,) = [c["argv"] for c in launch.calls if c["tool"] == "pdsh"]
    assert pdsh[:5] == ["-S", "-f", "1024", "-w", "localhost,127.0.0.1"]
    # The remote shell got the secret by sourcing the file, not from the command line.
    assert pdsh[5].startswith("source ") and pdsh[5].endswith(".sh;")
    assert "--venv_script" in launch.plan.argv
