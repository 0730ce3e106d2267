"""Rank, world size and rendezvous from simulated SLURM, MPI and DeepSpeed environments."""

from types import SimpleNamespace

import pytest

from megatron.launcher import (
    DistributedEnv,
    WorkerEnvironmentError,
    distributed_env_from_mpi,
    distributed_env_from_slurm,
    setup_distributed_env,
)

SLURM_TASK = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_NODEID": "2",
    "SLURM_JOB_NODELIST": "node[01-03,07]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
}


def test_slurm_task():
    env = distributed_env_from_slurm(SLURM_TASK)
    assert env == DistributedEnv(5, 1, 8, "node01", 29500, local_world_size=2)
    assert env.as_environ() == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "MASTER_ADDR": "node01",
        "MASTER_PORT": "29500",
        "LOCAL_WORLD_SIZE": "2",
    }


def test_slurm_step_values_win_over_job_values():
    environ = dict(SLURM_TASK, SLURM_STEP_NODELIST="gpu[7-8]", SLURM_STEP_NUM_TASKS="4")
    environ.update(SLURM_PROCID="3", SLURM_NODEID="1", SLURM_STEP_TASKS_PER_NODE="2(x2)")
    env = distributed_env_from_slurm(environ, master_port=1234)
    assert (env.world_size, env.master_addr, env.master_port) == (4, "gpu7", 1234)


def test_slurm_master_from_environment_then_setting():
    env = distributed_env_from_slurm(dict(SLURM_TASK, MASTER_ADDR="10.0.0.9", MASTER_PORT="7"))
    assert (env.master_addr, env.master_port) == ("10.0.0.9", 7)
    assert distributed_env_from_slurm(SLURM_TASK, master_addr="head").master_addr == "head"


def test_slurm_uneven_tasks_per_node():
    environ = dict(SLURM_TASK, SLURM_STEP_TASKS_PER_NODE="2(x2),1", SLURM_NODEID="2")
    environ.update(SLURM_PROCID="4", SLURM_LOCALID="0", SLURM_NTASKS="5")
    assert distributed_env_from_slurm(environ).local_world_size == 1


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SLURM_PROCID": None}, "SLURM: none of SLURM_PROCID is set"),
        ({"SLURM_NTASKS": None}, "SLURM_STEP_NUM_TASKS, SLURM_NTASKS, SLURM_NPROCS"),
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer"),
        ({"SLURM_PROCID": "8"}, "rank 8 is outside a world of 8"),
        ({"SLURM_LOCALID": "2"}, "local rank 2 is outside 2 local"),
        ({"SLURM_JOB_NODELIST": None}, "SLURM_JOB_NODELIST"),
        ({"SLURM_JOB_NODELIST": "node[1-"}, "SLURM_JOB_NODELIST='node[1-'"),
    ],
)
def test_slurm_errors_name_the_variable(change, message):
    environ = {k: v for k, v in {**SLURM_TASK, **change}.items() if v is not None}
    with pytest.raises(WorkerEnvironmentError, match=message.replace("[", r"\[")):
        distributed_env_from_slurm(environ)


OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "MASTER_ADDR": "n1",
}
MPICH = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
MVAPICH = {
    "MV2_COMM_WORLD_RANK": "1",
    "MV2_COMM_WORLD_SIZE": "2",
    "MV2_COMM_WORLD_LOCAL_RANK": "1",
    "MV2_COMM_WORLD_LOCAL_SIZE": "2",
}


def test_openmpi():
    assert distributed_env_from_mpi(OPENMPI) == DistributedEnv(3, 1, 4, "n1", 29500, 2)


def test_mpich_and_intel_mpi_with_master_setting():
    env = distributed_env_from_mpi(MPICH, master_addr="head", master_port=5000)
    assert env == DistributedEnv(2, 0, 4, "head", 5000, 2)


def test_mpich_through_deepspeeds_genv_variables():
    environ = {"PMI_RANK": "1", "WORLD_SIZE": "2", "MPI_LOCALRANKID": "1", "LOCAL_SIZE": "2"}
    assert distributed_env_from_mpi(environ) == DistributedEnv(1, 1, 2, "127.0.0.1", 29500, 2)


def test_mvapich_single_node_uses_localhost():
    assert distributed_env_from_mpi(MVAPICH).master_addr == "127.0.0.1"


def test_mpi_across_nodes_without_master_explains_what_to_set():
    environ = {k: v for k, v in OPENMPI.items() if k != "MASTER_ADDR"}
    with pytest.raises(WorkerEnvironmentError, match="MPI \\(OpenMPI\\): rank 3 of 4.*MASTER_ADDR"):
        distributed_env_from_mpi(environ)


def test_mpi_errors():
    with pytest.raises(WorkerEnvironmentError, match="OMPI_COMM_WORLD_RANK, MV2_COMM_WORLD_RANK"):
        distributed_env_from_mpi({"SLURM_PROCID": "0"})
    with pytest.raises(WorkerEnvironmentError, match="MPI_LOCALRANKID, PALS_LOCAL_RANKID"):
        distributed_env_from_mpi({"PMI_RANK": "0", "PMI_SIZE": "1"})


def test_setup_distributed_env_slurm_exports_for_torch():
    environ = dict(SLURM_TASK)
    launcher = SimpleNamespace(launcher="slurm", deepspeed_slurm=True, master_port=6001)
    env = setup_distributed_env(launcher, environ)
    assert env.rank == 5
    assert (environ["RANK"], environ["WORLD_SIZE"], environ["MASTER_ADDR"]) == ("5", "8", "node01")
    assert environ["MASTER_PORT"] == "6001" and environ["LOCAL_RANK"] == "1"


def test_setup_distributed_env_mpi():
    environ = dict(MPICH, MASTER_ADDR="n0")
    env = setup_distributed_env({"launcher": "mpich", "deepspeed_mpi": True}, environ)
    assert env == DistributedEnv(2, 0, 4, "n0", 29500, 2)
    assert environ["RANK"] == "2"


def test_setup_distributed_env_from_deepspeed_launch():
    environ = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29611",
        "LOCAL_SIZE": "2",
        "SLURM_PROCID": "0",  # a pdsh launch inside an allocation: SLURM is not the source
    }
    env = setup_distributed_env({}, environ)
    assert env == DistributedEnv(1, 1, 2, "127.0.0.1", 29611, 2)


def test_setup_distributed_env_single_process_without_launcher():
    environ = {}
    env = setup_distributed_env({"master_port": 29500}, environ)
    # One process: a free port, so a busy 29500 (another job) cannot break `python train.py`.
    assert (env.rank, env.local_rank, env.world_size, env.master_addr) == (0, 0, 1, "127.0.0.1")
    assert 0 < env.master_port < 65536 and environ["MASTER_PORT"] == str(env.master_port)
    assert environ["WORLD_SIZE"] == "1"
    assert setup_distributed_env({}, {"MASTER_PORT": "29777"}).master_port == 29777


def test_setup_distributed_env_partial_launch_variables():
    with pytest.raises(WorkerEnvironmentError, match="RANK set but LOCAL_RANK, WORLD_SIZE missing"):
        setup_distributed_env({}, {"RANK": "0"})
    with pytest.raises(WorkerEnvironmentError, match="WORLD_SIZE=2 but MASTER_ADDR is not set"):
        setup_distributed_env({}, {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"})
