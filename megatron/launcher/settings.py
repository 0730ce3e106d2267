"""The launcher settings as the runner code sees them, validated once.

`LauncherSettings` is the `launcher` config group (`megatron/config/groups/launcher.py` defines the
fields, their types and defaults) plus the checks the runner needs, so the launcher works
from a bare `LauncherSettings(num_gpus=2)` without loading a config.
`LauncherSettings.from_config(obj)` accepts anything with the GPT-NeoX launcher attribute
names (`cfg.launcher`, a `types.SimpleNamespace`, a dict); a missing attribute takes the
default. Keys are named in errors exactly as users write them in config files.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Literal, Union

from megatron.config.groups.launcher import LauncherConfig
from megatron.config.schema import field_types
from megatron.launcher.errors import LauncherError

# Values GPT-NeoX (with DeeperSpeed) accepted that DeepSpeed 0.19.8 has no backend for.
UNSUPPORTED_LAUNCHERS = {
    "jsrun": "DeepSpeed 0.19.8's runner has no jsrun (LSF) backend; DeeperSpeed's had one",
}
# The config's `launcher` values that DeepSpeed 0.19.8's runner accepts as `--launcher`
# (deepspeed/launcher/constants.py): pdsh, openmpi, mvapich, mpich, impi, slurm.
RUNNER_LAUNCHERS = tuple(
    name
    for name in typing.get_args(field_types(LauncherConfig)["launcher"])
    if name not in UNSUPPORTED_LAUNCHERS
)
# Launchers whose workers get their rank from the MPI runtime, not from DeepSpeed's launch.py.
MPI_LAUNCHERS = ("openmpi", "mvapich", "mpich", "impi")
DEFAULT_MASTER_PORT = LauncherConfig.master_port

# Where the workers of each mode find their rank (see megatron.launcher.environment).
WORKER_ENV_LAUNCH = "launch"  # RANK/LOCAL_RANK/WORLD_SIZE set by deepspeed.launcher.launch
WORKER_ENV_SLURM = "slurm"  # SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS/SLURM_JOB_NODELIST
WORKER_ENV_MPI = "mpi"  # OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_*


@dataclass(frozen=True)
class LauncherSettings(LauncherConfig):
    """The `launcher` config group, validated for the runner.

    Its fields, defaults and their documentation are `LauncherConfig`'s (one definition);
    this class adds the checks and the values the runner code derives from them.
    """

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
        if self.no_ssh:
            self._check_no_ssh()
        if self.deepspeed_mpi and self.launcher not in MPI_LAUNCHERS:
            raise LauncherError(
                f"deepspeed_mpi: true needs an MPI launcher ({', '.join(MPI_LAUNCHERS)}), "
                f"got launcher: {self.launcher!r}"
            )

    def _check_no_ssh(self) -> None:
        """`no_ssh: true` runs DeepSpeed's local launch.py on each node: no backend applies."""
        if self.launcher != "pdsh":
            raise LauncherError(
                f"no_ssh: true starts each node's ranks itself, so launcher: {self.launcher!r} "
                "would not be used; leave launcher unset (pdsh), or set no_ssh: false"
            )
        for key in ("force_multi", "launcher_args"):
            if getattr(self, key):
                raise LauncherError(
                    f"no_ssh: true starts each node's ranks itself, so {key}: "
                    f"{getattr(self, key)!r} (for the pdsh/srun/mpirun backends) would be "
                    f"ignored; remove {key}, or set no_ssh: false"
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


def _allowed_types(annotation: object) -> tuple[type, ...]:
    """The Python types a value of a field annotation may have (a Literal's: its values')."""
    if typing.get_origin(annotation) is Literal:
        return tuple(dict.fromkeys(type(a) for a in typing.get_args(annotation)))
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return tuple(t for arg in typing.get_args(annotation) for t in _allowed_types(arg))
    return (annotation,)


def _check_types(settings: LauncherSettings) -> None:
    for key, annotation in field_types(LauncherConfig).items():
        allowed = _allowed_types(annotation)
        value = getattr(settings, key)
        # bool is an int subclass: `num_gpus: true` is a mistake, not 1.
        wrong_bool = isinstance(value, bool) and bool not in allowed
        if wrong_bool or not isinstance(value, allowed):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise LauncherError(
                f"{key}: {value!r} has type {type(value).__name__}; expected {names}"
            )
