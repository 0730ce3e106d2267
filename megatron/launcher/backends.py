"""One class per DeepSpeed runner backend: what each needs on the runner's command line.

What DeepSpeed 0.19.8's runner does with each `--launcher` (deepspeed/launcher/
multinode_runner.py), and so what the classes below add:

* pdsh: `pdsh -S -f 1024 -w HOSTS 'export K=V; ...; cd CWD; python -u -m
  deepspeed.launcher.launch --world_info=... --node_rank=%n --master_addr=... SCRIPT ARGS'`.
  The arguments pass through a remote shell: only an argument containing a space is
  double-quoted, so anything else a shell treats specially (`'"$;&|<>()*?` ...) is altered.
  Without `--master_addr` the runner runs `ssh FIRST_HOST hostname -I`.
* slurm: `srun -n TOTAL [LAUNCHER_ARGS] [--nodelist H --nodes N] [--nodes N]
  [--gpus-per-node G] --export=ALL,K=V,... python -u SCRIPT ARGS` (needs `sinfo` on PATH).
  The runner has no `--comment` option in 0.19.8, so a SLURM comment or account goes
  through `--launcher_args`. No RANK is set: each task reads SLURM_PROCID.
* openmpi: `mpirun -n TOTAL -hostfile HOSTFILE --mca btl ^openib --mca btl_tcp_if_include
  eth0 [LAUNCHER_ARGS] -x K=V ... python -u SCRIPT ARGS` (needs `ompi_info`). It never
  exports MASTER_ADDR/MASTER_PORT, so `-x` adds them here.
* mpich / impi: `mpirun -n TOTAL -ppn P ... -genv MASTER_ADDR A -genv MASTER_PORT P -hosts
  H,...` (MPICH via DeepSpeed's launcher_helper.py, which sets RANK/LOCAL_RANK from PMI).
* mvapich: `mpirun -np TOTAL -ppn P --hostfile /tmp/deepspeed_mvapich_hostfile ...` (needs
  `mpiname` reporting MVAPICH2-GDR); MASTER_ADDR/PORT are added with `-genv`.

Every backend except a single-host pdsh needs `--force_multi`, or the runner silently falls
back to a local launch when the hostfile lists one host.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from megatron.launcher.errors import LauncherError
from megatron.launcher.plan import LaunchResources

_SHELL_SAFE_RE = re.compile(r"^[\w@%+=:,./-]+$")


class RunnerBackend:
    """Base: runner flags shared by all backends; subclasses add their own."""

    name = "pdsh"
    uses_ssh = True  # the runner checks passwordless ssh to the first host

    def check(self, plan: LaunchResources, script: str, user_args: Sequence[str]) -> None:
        """Raise LauncherError for anything this backend would mangle or reject."""

    def master_addr(self, plan: LaunchResources) -> str | None:
        """The `--master_addr` to pass (None: let the runner decide)."""
        return plan.settings.master_addr

    def launcher_words(self, plan: LaunchResources, forward_env: Sequence[str]) -> list[str]:
        """Backend arguments for `--launcher_args` (before the user's `launcher_args`)."""
        return []

    def extra_flags(self, plan: LaunchResources, env_script: str | None) -> list[str]:
        """Further runner flags."""
        return []


class PdshBackend(RunnerBackend):
    """pdsh over ssh; also the local launch when one host remains."""

    def check(self, plan: LaunchResources, script: str, user_args: Sequence[str]) -> None:
        if not plan.multi_node:
            return  # local launch: arguments go straight to subprocess, no shell
        for position, arg in enumerate([script, *user_args]):
            if not _SHELL_SAFE_RE.match(arg):
                what = "the script path" if position == 0 else f"user argument {position}"
                raise LauncherError(
                    f"launcher: pdsh passes arguments through a remote shell, and {what} "
                    f"({_clip(arg)!r}) holds characters it would alter or is empty; allowed: "
                    "letters, digits and _@%+=:,./- (pass the config bundle base64-encoded)"
                )

    def extra_flags(self, plan: LaunchResources, env_script: str | None) -> list[str]:
        # Sourced by the remote shell before launch.py starts: secrets never appear in argv.
        return ["--venv_script", env_script] if env_script and plan.multi_node else []


class SlurmBackend(RunnerBackend):
    """srun inside a SLURM allocation."""

    name = "slurm"
    uses_ssh = False

    def master_addr(self, plan: LaunchResources) -> str | None:
        # Only to keep the runner from ssh-ing for `hostname -I`: the workers take the
        # first node of SLURM's node list (megatron.launcher.environment).
        if plan.settings.master_addr or plan.hostfile is None:
            return plan.settings.master_addr
        return plan.hosts[0]

    def launcher_words(self, plan: LaunchResources, forward_env: Sequence[str]) -> list[str]:
        words = []
        if plan.settings.comment:
            words.append(f"--comment={plan.settings.comment}")
        if plan.settings.account:
            words.append(f"--account={plan.settings.account}")
        return words  # srun runs with --export=ALL: the environment needs no forwarding


class OpenMPIBackend(RunnerBackend):
    """OpenMPI's mpirun; only `-x` variables reach remote ranks."""

    name = "openmpi"

    def master_addr(self, plan: LaunchResources) -> str:
        return plan.settings.master_addr or plan.hosts[0]

    def launcher_words(self, plan: LaunchResources, forward_env: Sequence[str]) -> list[str]:
        words = ["-x", f"MASTER_ADDR={self.master_addr(plan)}"]
        words += ["-x", f"MASTER_PORT={plan.settings.master_port}"]
        for name in forward_env:  # by name only: mpirun copies the value from its env
            words += ["-x", name]
        return words


class HydraBackend(RunnerBackend):
    """MPICH and Intel MPI (hydra): the runner exports MASTER_ADDR/PORT itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    def master_addr(self, plan: LaunchResources) -> str:
        return plan.settings.master_addr or plan.hosts[0]


class MvapichBackend(HydraBackend):
    """MVAPICH2-GDR's mpirun; the runner exports no MASTER_ADDR/PORT, so add them."""

    def __init__(self) -> None:
        super().__init__("mvapich")

    def launcher_words(self, plan: LaunchResources, forward_env: Sequence[str]) -> list[str]:
        return [
            *("-genv", "MASTER_ADDR", self.master_addr(plan)),
            *("-genv", "MASTER_PORT", str(plan.settings.master_port)),
        ]


BACKENDS: dict[str, RunnerBackend] = {
    "pdsh": PdshBackend(),
    "slurm": SlurmBackend(),
    "openmpi": OpenMPIBackend(),
    "mpich": HydraBackend("mpich"),
    "impi": HydraBackend("impi"),
    "mvapich": MvapichBackend(),
}


def join_launcher_args(words: Sequence[str], user_text: str | None) -> str | None:
    """One `--launcher_args` string (the runner shlex-splits it) or None when empty."""
    try:
        user_words = shlex.split(user_text) if user_text else []
    except ValueError as err:
        message = f"launcher_args: {user_text!r} is not valid shell quoting ({err})"
        raise LauncherError(message) from None
    all_words = [*words, *user_words]
    return shlex.join(all_words) if all_words else None


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
