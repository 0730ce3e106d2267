"""build_runner_argv for every launcher mode, checked against DeepSpeed's own runner code."""

import logging
import shlex
import sys
from types import SimpleNamespace

import pytest
from deepspeed.launcher import multinode_runner as ds_backends
from deepspeed.launcher import runner as ds_runner

from megatron.launcher import LauncherError, build_runner_argv, planned_world_size

BUNDLE = ["--megatron_config", "eyJhIjoxfQ=="]


def argv_for(device_count=0, **launcher):
    return build_runner_argv(
        SimpleNamespace(**launcher), "train.py", BUNDLE, python="/py", device_count=device_count
    )


def ds_args(argv):
    """Parse our argv with DeepSpeed's own runner parser (proves every flag is accepted)."""
    assert argv[:3] == ["/py", "-m", "deepspeed.launcher.runner"]
    return ds_runner.parse_args(argv[3:])


@pytest.fixture
def hostfile(tmp_path):
    def write(text):
        path = tmp_path / "hostfile"
        path.write_text(text)
        return str(path)

    return write


def test_local_cpu_defaults_to_one_rank():
    argv = argv_for()
    assert argv == [
        "/py", "-m", "deepspeed.launcher.runner", "--num_gpus", "1", "--master_port", "29500",
        "--launcher", "pdsh", "--no_local_rank", "train.py", *BUNDLE,
    ]  # fmt: skip
    args = ds_args(argv)
    assert (args.num_gpus, args.launcher, args.no_local_rank) == (1, "pdsh", True)
    assert (args.user_script, args.user_args) == ("train.py", BUNDLE)
    assert not args.force_multi


def test_local_cpu_num_gpus_and_port():
    args = ds_args(argv_for(num_gpus=2, master_port=29611))
    assert (args.num_gpus, args.master_port) == (2, 29611)
    assert planned_world_size(SimpleNamespace(num_gpus=2), device_count=0) == 2


def test_local_gpus_are_all_used_unless_limited():
    assert "--num_gpus" not in argv_for(device_count=4)
    assert planned_world_size({}, device_count=4) == 4
    assert ds_args(argv_for(device_count=4, num_gpus=2)).num_gpus == 2
    with pytest.raises(LauncherError, match="num_gpus: 8 but host 'localhost' has only 4"):
        argv_for(device_count=4, num_gpus=8)


def test_json_user_args_are_fine_for_a_local_launch():
    argv = build_runner_argv({}, "train.py", ['{"a": 1}'], device_count=0)
    assert argv[-1] == '{"a": 1}'


def test_pdsh_hostfile_include_exclude_num_nodes(hostfile):
    path = hostfile("w0 slots=4\nw1 slots=4\nw2 slots=4\n")
    args = ds_args(argv_for(hostfile=path, num_nodes=2, num_gpus=2))
    assert (args.hostfile, args.num_nodes, args.num_gpus) == (path, 2, 2)
    assert args.master_addr == ""  # the runner asks the first host (`hostname -I`)
    assert planned_world_size({"hostfile": path, "num_nodes": 2, "num_gpus": 2}) == 4
    args = ds_args(argv_for(hostfile=path, include="w0:0,1@w2"))
    assert (args.include, args.num_gpus, args.num_nodes) == ("w0:0,1@w2", -1, -1)
    assert planned_world_size({"hostfile": path, "include": "w0:0,1@w2"}) == 6
    assert ds_args(argv_for(hostfile=path, exclude="w1")).exclude == "w1"
    assert planned_world_size({"hostfile": path, "exclude": "w1@w0:3"}) == 7


def test_our_resolution_matches_the_runners(hostfile):
    path = hostfile("w0 slots=4\nw1 slots=2\nw2 slots=4\n")
    from megatron.launcher import plan_resources

    for include, exclude, nodes, gpus in [
        ("w0:1,3@w2", "", -1, -1),
        ("", "w1@w0:0", -1, -1),
        ("", "", 2, -1),
        ("", "", -1, 1),
    ]:
        pool = ds_runner.fetch_hostfile(path)
        active = ds_runner.parse_inclusion_exclusion(pool, include, exclude)
        active = ds_runner.apply_num_nodes_and_gpus(active, nodes, gpus)
        ours = plan_resources(
            {
                "hostfile": path,
                "include": include,
                "exclude": exclude,
                "num_nodes": nodes,
                "num_gpus": None if gpus < 0 else gpus,
            }
        )
        assert dict(ours.resources) == dict(active)


def test_include_drops_num_gpus_with_a_warning_and_rejects_num_nodes(hostfile, caplog):
    path = hostfile("w0 slots=2\nw1 slots=2\n")
    with caplog.at_level(logging.WARNING):
        argv = argv_for(hostfile=path, include="w0", num_gpus=1)
    assert "--num_gpus" not in argv and "num_gpus: 1 is ignored" in caplog.text
    with pytest.raises(LauncherError, match="num_nodes: 1 cannot be combined with include"):
        argv_for(hostfile=path, include="w0", num_nodes=1)


def test_filters_are_checked_against_the_hostfile(hostfile):
    path = hostfile("w0 slots=2\n")
    with pytest.raises(LauncherError, match="include: host 'w5' is not in hostfile"):
        argv_for(hostfile=path, include="w5")
    with pytest.raises(LauncherError, match="num_nodes: 2 needs a hostfile"):
        argv_for(num_nodes=2)


def test_pdsh_multi_node_requires_shell_safe_arguments(hostfile):
    path = hostfile("w0 slots=2\nw1 slots=2\n")
    good = build_runner_argv({"hostfile": path}, "train.py", BUNDLE)
    assert good[-2:] == BUNDLE
    with pytest.raises(LauncherError, match="pdsh.*user argument 2"):
        build_runner_argv({"hostfile": path}, "train.py", ["--megatron_config", '{"a":1}'])
    with pytest.raises(LauncherError, match="the script path"):
        build_runner_argv({"hostfile": path}, "my train.py", BUNDLE)


def test_pdsh_force_multi_and_env_script(hostfile):
    path = hostfile("remote-node slots=2\n")
    argv = build_runner_argv(
        {"hostfile": path, "force_multi": True, "master_addr": "10.0.0.5"},
        "train.py",
        BUNDLE,
        python="/py",
        env_script="/shared/secrets.sh",
    )
    args = ds_args(argv)
    assert args.force_multi and args.venv_script == "/shared/secrets.sh"
    assert args.master_addr == "10.0.0.5"
    # DeepSpeed's pdsh backend sources the file on each node before launching.
    runner = ds_backends.PDSHRunner(args, "e30=")
    runner.add_export("PYTHONPATH", "/repo")
    cmd, _kill, _env = runner.get_cmd({}, {"remote-node": [0, 1]})
    assert cmd[:6] == ["pdsh", "-S", "-f", "1024", "-w", "remote-node"]
    assert cmd[6] == "source /shared/secrets.sh;"


def test_slurm_without_hostfile():
    argv = argv_for(
        device_count=2, launcher="slurm", deepspeed_slurm=True, num_gpus=2, comment="run 7 'x'"
    )  # GPUs (CPU ranks under SLURM: test_launch.py)
    args = ds_args(argv)
    assert (args.launcher, args.force_multi, args.no_ssh_check) == ("slurm", True, True)
    assert shlex.split(args.launcher_args) == ["--comment=run 7 'x'"]
    cmd = ds_backends.SlurmRunner(args, "e30=", {"localhost": 2}).get_cmd({}, {"localhost": [0, 1]})
    assert cmd[:4] == ["srun", "-n", "2", "--comment=run 7 'x'"]
    assert cmd[-3:] == ["train.py", *BUNDLE] and cmd[-5:-3] == [sys.executable, "-u"]


def test_slurm_with_hostfile_account_and_user_launcher_args(hostfile):
    path = hostfile("node01 slots=4\nnode02 slots=4\n")
    argv = argv_for(
        launcher="slurm",
        hostfile=path,
        account="proj-42",
        comment="c",
        launcher_args="--cpus-per-task=8 --exclusive",
    )
    args = ds_args(argv)
    assert args.master_addr == "node01"  # keeps the runner from ssh-ing for an address
    assert shlex.split(args.launcher_args) == [
        "--comment=c", "--account=proj-42", "--cpus-per-task=8", "--exclusive",
    ]  # fmt: skip
    assert planned_world_size({"launcher": "slurm", "hostfile": path}) == 8


def test_openmpi_exports_master_and_forwarded_names(hostfile):
    path = hostfile("n1 slots=2\nn2 slots=2\n")
    argv = build_runner_argv(
        {"launcher": "openmpi", "deepspeed_mpi": True, "hostfile": path, "master_port": 6000},
        "train.py",
        BUNDLE,
        python="/py",
        forward_env=["MEGATRON_SECRETS_FILE"],
    )
    args = ds_args(argv)
    assert (args.launcher, args.force_multi, args.master_addr) == ("openmpi", True, "n1")
    assert shlex.split(args.launcher_args) == [
        "-x", "MASTER_ADDR=n1", "-x", "MASTER_PORT=6000", "-x", "MEGATRON_SECRETS_FILE",
    ]  # fmt: skip
    cmd = ds_backends.OpenMPIRunner(args, "e30=", {"n1": 2, "n2": 2}).get_cmd({}, {})
    assert cmd[:5] == ["mpirun", "-n", "4", "-hostfile", path]
    assert "MASTER_ADDR=n1" in cmd and "MEGATRON_SECRETS_FILE" in cmd


@pytest.mark.parametrize("launcher", ["openmpi", "mpich", "impi", "mvapich"])
def test_mpi_launchers_need_a_hostfile_and_no_filters(launcher, hostfile):
    with pytest.raises(LauncherError, match=f"launcher: {launcher} needs a hostfile"):
        argv_for(launcher=launcher)
    path = hostfile("n1 slots=2\n")
    with pytest.raises(LauncherError, match="num_nodes/num_gpus"):
        argv_for(launcher=launcher, hostfile=path, num_gpus=1)
    with pytest.raises(LauncherError, match="include: launcher"):
        argv_for(launcher=launcher, hostfile=path, include="n1")


@pytest.mark.parametrize("launcher", ["mpich", "impi"])
def test_hydra_launchers_get_master_addr_from_the_runner(launcher, hostfile):
    path = hostfile("n1 slots=2\nn2 slots=2\n")
    args = ds_args(argv_for(launcher=launcher, hostfile=path, master_addr="10.1.1.1"))
    assert (args.launcher, args.force_multi, args.master_addr) == (launcher, True, "10.1.1.1")
    assert args.launcher_args == ""
    cmd = ds_backends.MPICHRunner(args, "e30=", {"n1": 2, "n2": 2}).get_cmd({}, {})
    assert ["-genv", "MASTER_ADDR", "10.1.1.1"] == cmd[cmd.index("MASTER_ADDR") - 1 :][:3]


def test_mvapich_exports_master_itself(hostfile):
    path = hostfile("n1 slots=2\n")
    args = ds_args(argv_for(launcher="mvapich", hostfile=path))
    assert shlex.split(args.launcher_args) == [
        "-genv", "MASTER_ADDR", "n1", "-genv", "MASTER_PORT", "29500",
    ]  # fmt: skip


def test_bad_launcher_args_quoting_names_the_key():
    with pytest.raises(LauncherError, match="launcher_args: .* not valid shell quoting"):
        argv_for(device_count=1, launcher="slurm", launcher_args="--comment='open")


def test_empty_script_is_rejected():
    with pytest.raises(LauncherError, match="script path is empty"):
        build_runner_argv({}, "", BUNDLE, device_count=0)
