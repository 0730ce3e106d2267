"""`no_ssh: true`: each node's plan and runner command, fed to DeepSpeed's own runner.

DeepSpeed 0.19.8's runner and launch.py run in this process with `subprocess.Popen` replaced
by a recorder, so the global ranks checked below are the ones DeepSpeed derives from our
command line (its launch.py), not ones we compute.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from megatron.launcher import LauncherError, planned_world_size, prepare_launch
from megatron.launcher.plan import plan_resources
from megatron.launcher.ports import choose_master_port
from tests.distributed import free_port

NO_SSH = {"no_ssh": True, "num_gpus": 2}
NODE = {"NNODES": "2", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29411", "PATH": "/bin"}


class Recorder:
    """Stands in for subprocess.Popen: keeps (argv, env) and exits at once with status 0."""

    calls: list[tuple[list[str], dict[str, str]]] = []

    def __init__(self, argv, env=None, **_):
        Recorder.calls.append((list(argv), dict(env or {})))
        self.pid, self.returncode = 4242, 0

    def poll(self):
        return 0

    def wait(self):
        return 0


def run_deepspeed(argv: list[str], monkeypatch) -> list[tuple[list[str], dict[str, str]]]:
    """Run DeepSpeed's runner on `argv` (ours), then the launch.py command it would start."""
    from deepspeed.launcher import launch, runner

    Recorder.calls = []
    monkeypatch.setattr(subprocess, "Popen", Recorder)
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setattr(launch.time, "sleep", lambda seconds: None)
    assert argv[1:3] == ["-m", "deepspeed.launcher.runner"]
    runner.main(argv[3:])
    [(launch_argv, _)] = Recorder.calls
    assert launch_argv[1:4] == ["-u", "-m", "deepspeed.launcher.launch"]
    Recorder.calls = []
    monkeypatch.setattr(sys, "argv", ["launch.py", *launch_argv[4:]])
    launch.main()
    return Recorder.calls


@pytest.mark.parametrize("node_rank, ranks", [(0, [0, 1]), (1, [2, 3])])
def test_each_node_starts_its_own_global_ranks(tmp_path, monkeypatch, node_rank, ranks):
    environ = {**NODE, "NODE_RANK": str(node_rank)}
    with prepare_launch(
        NO_SSH,
        "train.py",
        ["--megatron_config", "abc"],
        environ=environ,
        launch_dir=str(tmp_path),
        device_count=0,
    ) as plan:
        argv = plan.argv
        assert plan.world_size == 4 and not plan.resources.multi_node
        assert plan.env["DS_ACCELERATOR"] == "cpu"
        assert plan.describe() == (
            f"ranks {ranks[0]}-{ranks[1]} of 4 (node {node_rank} of 2 from NODE_RANK; master "
            "10.0.0.7 from MASTER_ADDR, port from MASTER_PORT)"
        )
        hostfile = argv[argv.index("--hostfile") + 1]
        with open(hostfile) as handle:
            assert handle.read() == "node-0 slots=2\nnode-1 slots=2\n"
        for flag, value in [("--node_rank", node_rank), ("--master_addr", "10.0.0.7")]:
            assert argv[argv.index(flag) + 1] == str(value)
        assert argv[argv.index("--master_port") + 1] == "29411"
        assert "--no_ssh" in argv and "--force_multi" not in argv and "--venv_script" not in argv
        workers = run_deepspeed(argv, monkeypatch)
    assert not os.path.exists(hostfile)
    assert [int(env["RANK"]) for _, env in workers] == ranks
    for local_rank, (worker_argv, env) in enumerate(workers):
        assert worker_argv[-3:] == ["train.py", "--megatron_config", "abc"]
        assert (env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("4", str(local_rank))
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.7", "29411")


def test_indexed_job_rank_and_precedence():
    job = {**NODE, "JOB_COMPLETION_INDEX": "1"}
    assert plan_resources(NO_SSH, environ=job).node.node_rank == 1
    both = {**job, "NODE_RANK": "0"}
    node = plan_resources(NO_SSH, environ=both).node
    assert (node.node_rank, node.rank_from) == (0, "NODE_RANK")  # NODE_RANK wins


def test_node_count_from_num_nodes_and_configured_rendezvous():
    settings = {**NO_SSH, "num_nodes": 3, "master_addr": "head", "master_port": 1234}
    plan = plan_resources(settings, environ={"NODE_RANK": "2"}, device_count=0)
    assert plan.world_size == 6
    assert (plan.node.master_addr, plan.node.master_port) == ("head", 1234)
    assert planned_world_size(NO_SSH, environ={**NODE, "NODE_RANK": "0"}, device_count=0) == 4


def test_port_is_never_a_free_one():
    # Node 1 keeps the default port even unset (a free port would differ between nodes).
    environ = {"NNODES": "2", "MASTER_ADDR": "h", "NODE_RANK": "1"}
    assert choose_master_port(NO_SSH, set_in=None, environ=environ) == 29500
    port = free_port()
    environ = {**environ, "NODE_RANK": "0", "MASTER_PORT": str(port)}
    assert choose_master_port(NO_SSH, set_in=None, environ=environ) == port


def test_taken_port_refused_on_node_zero_only():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = str(sock.getsockname()[1])
        environ = {**NODE, "MASTER_PORT": port, "NODE_RANK": "0"}
        with pytest.raises(LauncherError, match=f"{port} \\(from the MASTER_PORT variable\\)"):
            choose_master_port(NO_SSH, set_in=None, environ=environ)
        other = {**environ, "NODE_RANK": "1"}
        assert choose_master_port(NO_SSH, set_in=None, environ=other) == int(port)


@pytest.mark.parametrize(
    "settings, environ, message",
    [
        ({}, {"NODE_RANK": "2"}, r"NODE_RANK=2 is out of range; valid node ranks are 0-1"),
        ({}, {"NODE_RANK": "x"}, r"NODE_RANK='x' is not an integer; valid node ranks are 0-1"),
        ({}, {"NODE_RANK": "0", "MASTER_ADDR": ""}, r"needs rank 0's address: set MASTER_ADDR"),
        ({}, {"NODE_RANK": None}, r"needs this node's rank: set NODE_RANK \(valid node ranks"),
        ({}, {"NODE_RANK": "0", "NNODES": None}, r"needs the node count: set NNODES"),
        ({}, {"NODE_RANK": "0", "NNODES": "0"}, r"NNODES=0 is invalid"),
        ({}, {"NODE_RANK": "0", "MASTER_PORT": "70000"}, r"MASTER_PORT=70000 is not a TCP port"),
        ({"num_nodes": 3}, {"NODE_RANK": "0"}, r"NNODES=2 but num_nodes: 3; they must agree"),
        ({"launcher": "slurm"}, {}, r"no_ssh: true .* launcher: 'slurm' would not be used"),
        ({"force_multi": True}, {}, r"force_multi: True .* would be ignored"),
    ],
)
def test_bad_environment_refused_before_launch(settings, environ, message):
    merged = {k: v for k, v in {**NODE, **environ}.items() if v is not None}
    with pytest.raises(LauncherError, match=message):
        plan_resources({**NO_SSH, **settings}, environ=merged, device_count=0)


def test_hostfile_nodes_must_match_nnodes(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=2\nc slots=2\n")
    settings = {**NO_SSH, "hostfile": str(hostfile)}
    plan = plan_resources(settings, environ={**NODE, "NNODES": "3", "NODE_RANK": "2"})
    assert plan.world_size == 6 and plan.hostfile_text is None and plan.node.node_rank == 2
    with pytest.raises(LauncherError, match=r"say 2 node\(s\) but hostfile .* gives 3"):
        plan_resources(settings, environ={**NODE, "NODE_RANK": "0"})


STEP = {  # what srun gives each task of `srun --nodes=3 --ntasks-per-node=1`
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "gpu[07-09]",
    "SLURM_STEP_NUM_NODES": "3",
    "SLURM_STEP_NUM_TASKS": "3",
    "PATH": "/bin",
}


@pytest.mark.parametrize("node, rank", [("gpu07", 0), ("gpu09", 2)])
def test_one_deepy_per_node_of_an_srun_step_finds_its_place(node, rank):
    plan = plan_resources(NO_SSH, environ={**STEP, "SLURMD_NODENAME": node}, device_count=0)
    assert (plan.node.node_rank, plan.node.nnodes, plan.node.master_addr) == (rank, 3, "gpu07")
    assert plan.world_size == 6 and plan.node.rank_from == "the SLURM step"
    # NODE_RANK, NNODES and MASTER_ADDR still win where a user sets them
    mine = {**STEP, "SLURMD_NODENAME": node, "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.7"}
    assert plan_resources(NO_SSH, environ=mine, device_count=0).node.node_rank == 1


def test_a_batch_script_is_not_node_0_and_several_tasks_per_node_are_refused():
    batch = {k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}  # no step: the batch host
    with pytest.raises(LauncherError, match="needs the node count"):
        plan_resources(NO_SSH, environ={**batch, "SLURMD_NODENAME": "gpu07"}, device_count=0)
    two = {**STEP, "SLURM_STEP_NUM_TASKS": "6", "SLURMD_NODENAME": "gpu07"}
    with pytest.raises(LauncherError, match="one deepy.py per node.*--ntasks-per-node=1"):
        plan_resources(NO_SSH, environ=two, device_count=0)
