"""Launcher: from the `launcher` config group to running workers, and back to a rank.

Launcher side (`deepy.py`):

* `prepare_launch(cfg.launcher, script, user_args)`: context manager giving a `LaunchPlan`
  (`argv`, `env`, `world_size`, `display()`, `describe()`), with secrets kept off every
  command line; `run_launch(plan)` runs it; `verbose=True` shows DeepSpeed's INFO lines.
  A `StagedFile` argument (a large config bundle) reaches the workers as a file's path.
  A Ctrl-C on a launch whose ranks run here: each saves and exits, none is left behind
  (`stopping.py`).
* `build_runner_argv(cfg.launcher, script, user_args)`: just the runner command line.
* `planned_world_size(cfg.launcher)`: how many workers the launch starts.
* `no_ssh: true` (`nossh.py`): every node runs deepy.py; `plan_resources` reads this node's
  rank, the node count and the rendezvous from NODE_RANK/JOB_COMPLETION_INDEX, NNODES,
  MASTER_ADDR, MASTER_PORT into `LaunchResources.node`, and `plan.describe()` names its ranks.
* `check_optional_packages(script, group)` (`optional_packages.py`): refuses a run that needs
  a package this Python lacks, with the pip command; `choose_master_port` (`ports.py`): a free
  port for a one-machine run that sets none, a set one refused when taken.
* `redact_argv`, `redact_env`, `redact_text`: printable forms of commands and environments.

Worker side (`train.py` and friends), in this order:

* `setup_distributed_env(cfg.launcher)`: secrets, RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* from
  the DeepSpeed launcher, SLURM or MPI; returns a `DistributedEnv`.
* `init_distributed(backend=None)`: NCCL with CUDA, else gloo, through DeepSpeed.

Helpers: `expand_slurm_nodelist`, `distributed_env_from_slurm`, `distributed_env_from_mpi`,
`read_hostfile`, `parse_hostfile_text`, `parse_resource_filter`.
"""

from megatron.launcher.distributed import init_distributed
from megatron.launcher.environment import (
    DistributedEnv,
    distributed_env_from_mpi,
    distributed_env_from_slurm,
    setup_distributed_env,
)
from megatron.launcher.errors import HostfileError, LauncherError, WorkerEnvironmentError
from megatron.launcher.hostfile import parse_hostfile_text, parse_resource_filter, read_hostfile
from megatron.launcher.launch import LaunchPlan, StagedFile, prepare_launch, run_launch
from megatron.launcher.nodelist import expand_slurm_nodelist, expand_slurm_tasks_per_node
from megatron.launcher.plan import LaunchResources, plan_resources, planned_world_size
from megatron.launcher.runner import build_runner_argv
from megatron.launcher.secrets import (
    SECRETS_FILE_VAR,
    is_secret_name,
    load_forwarded_secrets,
    redact_argv,
    redact_env,
    redact_text,
)
from megatron.launcher.settings import RUNNER_LAUNCHERS, LauncherSettings

__all__ = [
    "RUNNER_LAUNCHERS",
    "SECRETS_FILE_VAR",
    "DistributedEnv",
    "HostfileError",
    "LaunchPlan",
    "StagedFile",
    "LaunchResources",
    "LauncherError",
    "LauncherSettings",
    "WorkerEnvironmentError",
    "build_runner_argv",
    "distributed_env_from_mpi",
    "distributed_env_from_slurm",
    "expand_slurm_nodelist",
    "expand_slurm_tasks_per_node",
    "init_distributed",
    "is_secret_name",
    "load_forwarded_secrets",
    "parse_hostfile_text",
    "parse_resource_filter",
    "plan_resources",
    "planned_world_size",
    "prepare_launch",
    "read_hostfile",
    "redact_argv",
    "redact_env",
    "redact_text",
    "run_launch",
    "setup_distributed_env",
]
