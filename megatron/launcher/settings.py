"""The launcher settings as the runner code sees them, validated once.

`LauncherSettings.from_config(obj)` accepts anything with the GPT-NeoX launcher attribute
names (`cfg.launcher`, a `types.SimpleNamespace`, a dict); a missing attribute takes the
default below. Keys are named in errors exactly as users write them in config files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from megatron.launcher.errors import LauncherError

# The `--launcher` values DeepSpeed 0.19.8's runner accepts (deepspeed/launcher/constants.py).
RUNNER_LAUNCHERS = ("pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi")
# Launchers whose workers get their rank from the MPI runtime, not from DeepSpeed's launch.py.
MPI_LAUNCHERS = ("openmpi", "mvapich", "mpich", "impi")
# Values GPT-NeoX (with DeeperSpeed) accepted that DeepSpeed 0.19.8 has no backend for.
UNSUPPORTED_LAUNCHERS = {
    "jsrun": "DeepSpeed 0.19.8's runner has no jsrun (LSF) backend; DeeperSpeed's had one",
}
DEFAULT_MASTER_PORT = 29500

# Where the workers of each mode find their rank (see megatron.launcher.environment).
WORKER_ENV_LAUNCH = "launch"  # RANK/LOCAL_RANK/WORLD_SIZE set by deepspeed.launcher.launch
WORKER_ENV_SLURM = "slurm"  # SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS/SLURM_JOB_NODELIST
WORKER_ENV_MPI = "mpi"  # OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_*


@dataclass(frozen=True)
class LauncherSettings:
    """How the DeepSpeed runner starts the workers (the `launcher` config group)."""

    launcher: str = "pdsh"
    """Multi-node backend: pdsh, openmpi, mvapich, slurm, mpich or impi (case-insensitive)."""

    deepspeed_slurm: bool = False
    """Workers take rank, world size and master address from SLURM's environment."""

    deepspeed_mpi: bool = False
    """Workers take rank and world size from the MPI runtime's environment."""

    hostfile: str | None = None
    """DeepSpeed hostfile, one `host slots=N` per line; None: local machine only."""

    include: str | None = None
    """Hosts/slots to use, `NAME[:SLOT[,SLOT...]][@NAME...]`, e.g. `worker-0:0,1@worker-1`."""

    exclude: str | None = None
    """Hosts/slots to leave out, same syntax as `include`."""

    num_nodes: int = -1
    """Use the first N hosts of the hostfile; -1: all."""

    num_gpus: int | None = None
    """Workers per node; None: every GPU, or 1 CPU rank on a machine without GPUs."""

    master_port: int = DEFAULT_MASTER_PORT
    """Rendezvous TCP port of rank 0."""

    master_addr: str | None = None
    """Rendezvous address of rank 0; None: 127.0.0.1 locally, else the first host."""

    comment: str | None = None
    """SLURM job comment, passed to srun as `--comment`."""

    account: str | None = None
    """SLURM account, passed to srun as `--account`."""

    force_multi: bool = False
    """Use the multi-node backend even for a single host (e.g. one remote node)."""

    no_ssh_check: bool = False
    """Skip the runner's passwordless-ssh check of the first host."""

    launcher_args: str | None = None
    """Extra arguments for pdsh/srun/mpirun, one shell-quoted string."""

    def __post_init__(self) -> None:
        _check_types(self)
        name = self.launcher.strip().lower()
        if name in UNSUPPORTED_LAUNCHERS:
            raise LauncherError(
                f"launcher: {self.launcher!r} is not supported: {UNSUPPORTED_LAUNCHERS[name]}. "
                f"Valid: {', '.join(RUNNER_LAUNCHERS)}"
            )
        if name not in RUNNER_LAUNCHERS:
            raise LauncherError(
                f"launcher: {self.launcher!r} is not a DeepSpeed runner backend. "
                f"Valid: {', '.join(RUNNER_LAUNCHERS)}"
            )
        object.__setattr__(self, "launcher", name)
        for key in ("hostfile", "include", "exclude", "master_addr", "comment", "account"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                object.__setattr__(self, key, None)  # "" means unset, as on the runner's CLI
        self._check_values()

    def _check_values(self) -> None:
        if self.num_nodes == 0 or self.num_nodes < -1:
            raise LauncherError(f"num_nodes: {self.num_nodes} is invalid; use -1 (all) or N >= 1")
        if self.num_gpus is not None and self.num_gpus < 1:
            raise LauncherError(f"num_gpus: {self.num_gpus} is invalid; use None (all) or N >= 1")
        if not 1 <= self.master_port <= 65535:
            raise LauncherError(f"master_port: {self.master_port} is not a TCP port (1-65535)")
        if self.include and self.exclude:
            raise LauncherError(
                f"include ({self.include!r}) and exclude ({self.exclude!r}) are mutually "
                "exclusive; set only one"
            )
        if self.deepspeed_slurm and self.deepspeed_mpi:
            raise LauncherError("deepspeed_slurm and deepspeed_mpi are both true; set only one")
        if self.deepspeed_slurm and self.launcher != "slurm":
            raise LauncherError(
                f"deepspeed_slurm: true needs launcher: slurm (got launcher: {self.launcher!r}); "
                "the workers read their rank from srun's SLURM_PROCID"
            )
        if self.deepspeed_mpi and self.launcher not in MPI_LAUNCHERS:
            raise LauncherError(
                f"deepspeed_mpi: true needs an MPI launcher ({', '.join(MPI_LAUNCHERS)}), "
                f"got launcher: {self.launcher!r}"
            )

    @classmethod
    def from_config(cls, obj: object) -> LauncherSettings:
        """Build from `cfg.launcher`, a namespace or a mapping; missing keys take defaults."""
        if isinstance(obj, LauncherSettings):
            return obj
        values = {}
        for f in fields(cls):
            value = obj.get(f.name) if isinstance(obj, Mapping) else getattr(obj, f.name, None)
            if value is not None:
                values[f.name] = value
        return cls(**values)

    @property
    def is_mpi(self) -> bool:
        """Whether the backend is an MPI `mpirun` (no per-slot include/exclude, no num_gpus)."""
        return self.launcher in MPI_LAUNCHERS

    @property
    def worker_env(self) -> str:
        """Where workers read their rank: WORKER_ENV_LAUNCH, WORKER_ENV_SLURM or WORKER_ENV_MPI.

        `launcher: slurm` and the MPI launchers start the script directly (no DeepSpeed
        launch.py sets RANK), so their workers read the scheduler's variables even when
        deepspeed_slurm/deepspeed_mpi was left false.
        """
        if self.deepspeed_slurm or self.launcher == "slurm":
            return WORKER_ENV_SLURM
        if self.deepspeed_mpi or self.is_mpi:
            return WORKER_ENV_MPI
        return WORKER_ENV_LAUNCH


_TYPES = {
    "launcher": (str,),
    "deepspeed_slurm": (bool,),
    "deepspeed_mpi": (bool,),
    "hostfile": (str, type(None)),
    "include": (str, type(None)),
    "exclude": (str, type(None)),
    "num_nodes": (int,),
    "num_gpus": (int, type(None)),
    "master_port": (int,),
    "master_addr": (str, type(None)),
    "comment": (str, type(None)),
    "account": (str, type(None)),
    "force_multi": (bool,),
    "no_ssh_check": (bool,),
    "launcher_args": (str, type(None)),
}


def _check_types(settings: LauncherSettings) -> None:
    for key, allowed in _TYPES.items():
        value = getattr(settings, key)
        # bool is an int subclass: `num_gpus: true` is a mistake, not 1.
        wrong_bool = isinstance(value, bool) and bool not in allowed
        if wrong_bool or not isinstance(value, allowed):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise LauncherError(
                f"{key}: {value!r} has type {type(value).__name__}; expected {names}"
            )
