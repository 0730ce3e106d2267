"""prepare_launch inside a SLURM allocation: a hostfile of the allocation's nodes."""

import os

import pytest

from megatron.launcher import LauncherError, planned_world_size, prepare_launch
from megatron.launcher.plan import plan_resources

ALLOCATION = {"SLURM_JOB_NODELIST": "gpu[01-03]", "SLURM_GPUS_ON_NODE": "4", "PATH": "/bin"}
SLURM = {"launcher": "slurm", "deepspeed_slurm": True}


def test_slurm_allocation_becomes_a_hostfile(tmp_path):
    with prepare_launch(
        SLURM,
        "train.py",
        ["--megatron_config", "abc"],
        environ=ALLOCATION,
        launch_dir=str(tmp_path),
        device_count=4,
    ) as plan:
        assert plan.world_size == 12
        path = plan.argv[plan.argv.index("--hostfile") + 1]
        with open(path) as handle:
            assert handle.read() == "gpu01 slots=4\ngpu02 slots=4\ngpu03 slots=4\n"
        assert plan.argv[plan.argv.index("--master_addr") + 1] == "gpu01"
    assert not os.path.exists(path)
    assert planned_world_size(SLURM, environ=ALLOCATION, device_count=4) == 12


@pytest.mark.parametrize(
    "extra, settings, slots",
    [
        ({}, {"num_gpus": 2}, 2),  # num_gpus wins
        ({"SLURM_GPUS_ON_NODE": None, "SLURM_NTASKS_PER_NODE": "8"}, {}, 8),
        ({"SLURM_GPUS_ON_NODE": None}, {}, 4),  # this machine's GPUs
    ],
)
def test_slots_per_node(extra, settings, slots):
    environ = {k: v for k, v in {**ALLOCATION, **extra}.items() if v is not None}
    plan = plan_resources({**SLURM, **settings}, environ=environ, device_count=4)
    assert dict(plan.resources) == {f"gpu0{i}": list(range(slots)) for i in (1, 2, 3)}


def test_single_node_allocation_or_explicit_hostfile_needs_no_generated_file(tmp_path):
    one = dict(ALLOCATION, SLURM_JOB_NODELIST="gpu07")
    assert plan_resources(SLURM, environ=one, device_count=4).hostfile_text is None
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\nb slots=1\n")
    plan = plan_resources({**SLURM, "hostfile": str(hostfile)}, environ=ALLOCATION)
    assert plan.hostfile_text is None and plan.world_size == 2
    # Other launchers ignore the allocation: pdsh without hostfile is a local launch.
    assert plan_resources({}, environ=ALLOCATION, device_count=0).world_size == 1


def test_num_nodes_trims_the_allocation_and_is_checked():
    assert planned_world_size({**SLURM, "num_nodes": 2}, environ=ALLOCATION) == 8
    with pytest.raises(LauncherError, match="num_nodes: 5 but only 3 host"):
        planned_world_size({**SLURM, "num_nodes": 5}, environ=ALLOCATION)


@pytest.mark.parametrize("verbose, level", [(False, "critical"), (True, "info")])
def test_verbosity_reaches_the_runner_and_the_workers(tmp_path, verbose, level):
    with prepare_launch(
        {"num_gpus": 2},
        "train.py",
        ["--megatron_config", "abc"],
        environ={"PATH": "/bin"},
        launch_dir=str(tmp_path),
        device_count=0,
        verbose=verbose,
    ) as plan:
        argv = plan.argv
    # The runner's INFO lines carry the worker commands (and bundle), its ERROR line a failed
    # worker's command: shown only if verbose (deepy.py reports a failure itself).
    assert argv[argv.index("--log_level") + 1] == level
    tail = argv[argv.index("train.py") :]
    assert tail == ["train.py", "--megatron_config", "abc", *(["--verbose"] if verbose else [])]


@pytest.mark.parametrize("environ", [dict(ALLOCATION, SLURM_GPUS_ON_NODE="0"), {"PATH": "/bin"}])
def test_cpu_ranks_under_slurm_are_hostfile_slots_not_a_gpu_request(tmp_path, environ):
    # DeepSpeed's SLURM runner turns --num_gpus into `srun --gpus-per-node`, which SLURM
    # refuses on nodes without GPUs ("Invalid generic resource (gres) specification").
    with prepare_launch(
        {**SLURM, "num_gpus": 2},
        "train.py",
        ["--megatron_config", "abc"],
        environ=environ,
        launch_dir=str(tmp_path),
        device_count=0,
    ) as plan:
        assert "--num_gpus" not in plan.argv
        with open(plan.argv[plan.argv.index("--hostfile") + 1]) as handle:
            slots = handle.read().split()[1::2]
    nodes = 3 if "SLURM_JOB_NODELIST" in environ else 1
    assert slots == ["slots=2"] * nodes and plan.world_size == 2 * nodes


def test_gpus_under_slurm_are_still_requested_per_node(tmp_path):
    with prepare_launch(
        {**SLURM, "num_gpus": 2},
        "train.py",
        ["--megatron_config", "abc"],
        environ=ALLOCATION,
        launch_dir=str(tmp_path),
        device_count=4,
    ) as plan:
        assert plan.argv[plan.argv.index("--num_gpus") + 1] == "2"
