"""Worker side: find this process's rank, world size and rendezvous address.

Three sources, one class each, chosen by `LauncherSettings.worker_env`:

* `LaunchEnvReader`: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as set by
  DeepSpeed's launch.py (local and pdsh launches) or torchrun. None of them set means a
  single process (`python train.py ...` without a launcher), which rendezvous on a free
  local port (unless MASTER_PORT is set) so it cannot collide with another job's 29500.
* `SlurmEnvReader`: SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS/SLURM_NTASKS and the
  node list (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST); rank 0 runs on its first node.
* `MpiEnvReader`: OpenMPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE), MVAPICH
  (MV2_COMM_WORLD_*), MPICH and Intel MPI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
  MPI_LOCALNRANKS). MPI does not tell a rank where rank 0 runs, so MASTER_ADDR must be in
  the environment (deepy.py exports it for every MPI backend), or `master_addr` must be
  set, or all ranks must share one node (then 127.0.0.1 is used).

The rendezvous address is taken, in order, from MASTER_ADDR in the environment, the
`master_addr` setting, then the source's own rule; the port from MASTER_PORT, then
`master_port`. `setup_distributed_env` exports the result as RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE (when known), MASTER_ADDR and MASTER_PORT for `torch.distributed`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from megatron.launcher.errors import WorkerEnvironmentError
from megatron.launcher.nodelist import expand_slurm_nodelist, expand_slurm_tasks_per_node
from megatron.launcher.secrets import load_forwarded_secrets
from megatron.launcher.settings import (
    DEFAULT_MASTER_PORT,
    WORKER_ENV_LAUNCH,
    WORKER_ENV_MPI,
    WORKER_ENV_SLURM,
    LauncherSettings,
)

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class DistributedEnv:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    local_world_size: int | None = None

    def as_environ(self) -> dict[str, str]:
        """The variables `torch.distributed`'s env:// rendezvous and DeepSpeed read."""
        env = {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.local_world_size is not None:
            env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        return env


def _get_int(environ: Mapping[str, str], names: tuple[str, ...], source: str) -> int | None:
    """The integer in the first of `names` that is set, or None when none is."""
    for name in names:
        if name in environ:
            try:
                return int(environ[name])
            except ValueError:
                raise WorkerEnvironmentError(
                    f"{source}: {name}={environ[name]!r} is not an integer"
                ) from None
    return None


def _require_int(environ: Mapping[str, str], names: tuple[str, ...], source: str) -> int:
    value = _get_int(environ, names, source)
    if value is None:
        raise WorkerEnvironmentError(
            f"{source}: none of {', '.join(names)} is set; is this process running under "
            f"the {source} launcher?"
        )
    return value


def _make_env(source: str, rank: int, local_rank: int, world_size: int, **rest) -> DistributedEnv:
    if world_size < 1 or not 0 <= rank < world_size:
        raise WorkerEnvironmentError(f"{source}: rank {rank} is outside a world of {world_size}")
    local_world_size = rest.get("local_world_size")
    if local_rank < 0 or (local_world_size is not None and local_rank >= local_world_size):
        raise WorkerEnvironmentError(
            f"{source}: local rank {local_rank} is outside {local_world_size} local processes"
        )
    return DistributedEnv(rank, local_rank, world_size, **rest)


def _port(environ: Mapping[str, str], default: int, source: str) -> int:
    return _get_int(environ, ("MASTER_PORT",), source) or default


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((addr if addr == LOCALHOST else "", 0))
        return sock.getsockname()[1]


class SlurmEnvReader:
    """Rank and rendezvous from srun's task environment."""

    source = "SLURM"

    def read(self, environ: Mapping[str, str], master_addr: str | None, master_port: int):
        src = self.source
        rank = _require_int(environ, ("SLURM_PROCID",), src)
        local_rank = _require_int(environ, ("SLURM_LOCALID",), src)
        world = _require_int(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"), src)
        addr = environ.get("MASTER_ADDR") or master_addr
        if not addr:
            names = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
            name = next((n for n in names if environ.get(n)), None)
            if name is None:
                raise WorkerEnvironmentError(
                    f"SLURM: none of {', '.join(names)} is set, so rank 0's node is unknown; "
                    "run under srun, or set MASTER_ADDR"
                )
            addr = expand_slurm_nodelist(environ[name], name)[0]
        return _make_env(
            src,
            rank,
            local_rank,
            world,
            master_addr=addr,
            master_port=_port(environ, master_port, src),
            local_world_size=self._local_world_size(environ),
        )

    @staticmethod
    def _local_world_size(environ: Mapping[str, str]) -> int | None:
        per_node = environ.get("SLURM_STEP_TASKS_PER_NODE")
        node = _get_int(environ, ("SLURM_NODEID",), "SLURM")
        if per_node and node is not None:
            counts = expand_slurm_tasks_per_node(per_node)
            return counts[node] if node < len(counts) else None
        return _get_int(environ, ("SLURM_NTASKS_PER_NODE",), "SLURM")


@dataclass(frozen=True)
class MpiFlavor:
    """The variables one MPI implementation sets, each a tuple of accepted names."""

    name: str
    rank: tuple[str, ...]
    size: tuple[str, ...]
    local_rank: tuple[str, ...]
    local_size: tuple[str, ...]


MPI_FLAVORS = (
    MpiFlavor(
        "OpenMPI",
        ("OMPI_COMM_WORLD_RANK",),
        ("OMPI_COMM_WORLD_SIZE",),
        ("OMPI_COMM_WORLD_LOCAL_RANK",),
        ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    ),
    MpiFlavor(
        "MVAPICH",
        ("MV2_COMM_WORLD_RANK",),
        ("MV2_COMM_WORLD_SIZE",),
        ("MV2_COMM_WORLD_LOCAL_RANK",),
        ("MV2_COMM_WORLD_LOCAL_SIZE",),
    ),
    # DeepSpeed's MPICH/IMPI backends also -genv WORLD_SIZE and LOCAL_SIZE.
    MpiFlavor(
        "MPICH/Intel MPI",
        ("PMI_RANK", "PMIX_RANK"),
        ("PMI_SIZE", "WORLD_SIZE"),
        ("MPI_LOCALRANKID", "PALS_LOCAL_RANKID"),
        ("MPI_LOCALNRANKS", "LOCAL_SIZE"),
    ),
)


class MpiEnvReader:
    """Rank from whichever MPI implementation started this process."""

    source = "MPI"

    def read(self, environ: Mapping[str, str], master_addr: str | None, master_port: int):
        flavor = next((f for f in MPI_FLAVORS if any(n in environ for n in f.rank)), None)
        if flavor is None:
            expected = ", ".join(f.rank[0] for f in MPI_FLAVORS)
            raise WorkerEnvironmentError(
                f"MPI: no MPI rank variable is set (expected one of {expected}); is this "
                "process running under mpirun?"
            )
        src = f"MPI ({flavor.name})"
        rank = _require_int(environ, flavor.rank, src)
        world = _require_int(environ, flavor.size, src)
        local_rank = _require_int(environ, flavor.local_rank, src)
        local_size = _get_int(environ, flavor.local_size, src)
        addr = environ.get("MASTER_ADDR") or master_addr
        if not addr and local_size == world:
            addr = LOCALHOST  # every rank runs on this node
        if not addr:
            raise WorkerEnvironmentError(
                f"{src}: rank {rank} of {world}: MASTER_ADDR is not set and the ranks span "
                "several nodes, so rank 0's address is unknown. deepy.py exports it for "
                "every MPI launcher; when starting mpirun yourself, export MASTER_ADDR=<host "
                "of rank 0> (the first host of the hostfile), or set master_addr"
            )
        return _make_env(
            src,
            rank,
            local_rank,
            world,
            master_addr=addr,
            master_port=_port(environ, master_port, src),
            local_world_size=local_size,
        )


class LaunchEnvReader:
    """Rank from DeepSpeed's launch.py or torchrun (RANK, LOCAL_RANK, WORLD_SIZE, ...)."""

    source = "DeepSpeed launch"

    def read(self, environ: Mapping[str, str], master_addr: str | None, master_port: int):
        src = self.source
        names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
        present = [n for n in names if n in environ]
        if not present:  # a plain `python train.py`: one process, any free port will do
            addr = environ.get("MASTER_ADDR") or LOCALHOST
            port = _get_int(environ, ("MASTER_PORT",), src) or _free_port(addr)
            return DistributedEnv(0, 0, 1, addr, port, 1)
        if len(present) < len(names):
            missing = ", ".join(n for n in names if n not in environ)
            raise WorkerEnvironmentError(
                f"{src}: {', '.join(present)} set but {missing} missing; start workers with "
                "deepy.py (or set all of RANK, LOCAL_RANK, WORLD_SIZE)"
            )
        world = _require_int(environ, ("WORLD_SIZE",), src)
        addr = environ.get("MASTER_ADDR") or master_addr or (LOCALHOST if world == 1 else None)
        if not addr:
            raise WorkerEnvironmentError(f"{src}: WORLD_SIZE={world} but MASTER_ADDR is not set")
        return _make_env(
            src,
            _require_int(environ, ("RANK",), src),
            _require_int(environ, ("LOCAL_RANK",), src),
            world,
            master_addr=addr,
            master_port=_port(environ, master_port, src),
            local_world_size=_get_int(environ, ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"), src),
        )


ENV_READERS = {
    WORKER_ENV_LAUNCH: LaunchEnvReader(),
    WORKER_ENV_SLURM: SlurmEnvReader(),
    WORKER_ENV_MPI: MpiEnvReader(),
}


def distributed_env_from_slurm(
    environ: Mapping[str, str],
    *,
    master_addr: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
) -> DistributedEnv:
    """Rank, local rank, world size and rendezvous of an srun task (see module docstring)."""
    return SlurmEnvReader().read(environ, master_addr, master_port)


def distributed_env_from_mpi(
    environ: Mapping[str, str],
    *,
    master_addr: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
) -> DistributedEnv:
    """The same for an OpenMPI, MVAPICH, MPICH or Intel MPI rank (see module docstring)."""
    return MpiEnvReader().read(environ, master_addr, master_port)


def setup_distributed_env(
    launcher: object, environ: MutableMapping[str, str] | None = None
) -> DistributedEnv:
    """Worker entry: load forwarded secrets, find the rank, export it for torch.distributed.

    `launcher` is `cfg.launcher` (any object/mapping with the launcher keys). Call it once
    at the start of every worker, before `init_distributed()`; it sets RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_WORLD_SIZE when known) in `environ`
    (default `os.environ`) and copies secrets from `$MEGATRON_SECRETS_FILE` into it.
    """
    settings = LauncherSettings.from_config(launcher)
    environ = os.environ if environ is None else environ
    load_forwarded_secrets(environ)
    reader = ENV_READERS[settings.worker_env]
    env = reader.read(environ, settings.master_addr, settings.master_port)
    environ.update(env.as_environ())
    return env
