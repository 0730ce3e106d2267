"""The exact command line that starts `deepspeed.launcher.runner` for a launch.

`build_runner_argv(cfg.launcher, "train.py", ["--megatron_config", bundle])` returns

    [python, "-m", "deepspeed.launcher.runner", --hostfile H, --include I | --exclude E,
     --num_nodes N, --num_gpus G, --master_addr A, --master_port P, --launcher L,
     --launcher_args "...", --force_multi, --no_ssh_check, --no_ssh --node_rank R,
     --venv_script S, --log_level LEVEL, --no_local_rank, SCRIPT, *USER_ARGS]

with each optional flag present only when it applies. The runner is started as a module of
the given Python, so no `deepspeed` console script is needed on PATH. `--no_local_rank` is
always passed: every worker reads LOCAL_RANK from its environment, which works the same
for local, pdsh, SLURM and MPI launches (only the local/pdsh launch.py would append
`--local_rank=N`). With `no_ssh: true` the rendezvous and node rank are this node's
(megatron.launcher.nossh), and the hostfile lists the nodes of the world.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from megatron.launcher.backends import BACKENDS, join_launcher_args
from megatron.launcher.errors import LauncherError
from megatron.launcher.plan import LaunchResources, plan_resources

RUNNER_MODULE = "deepspeed.launcher.runner"


def build_runner_argv(
    launcher: object,
    script: str,
    user_args: Sequence[str],
    *,
    python: str = sys.executable,
    device_count: int | None = None,
    forward_env: Sequence[str] = (),
    env_script: str | None = None,
    log_level: str | None = None,
) -> list[str]:
    """The argv that runs DeepSpeed's runner for `script` with `user_args` on every rank.

    Args:
        launcher: `cfg.launcher`, a `LauncherSettings`, or any object/mapping with the
            launcher keys (launcher, deepspeed_slurm, deepspeed_mpi, hostfile, include,
            exclude, num_nodes, num_gpus, master_port, master_addr, comment, account,
            force_multi, no_ssh_check, no_ssh, launcher_args); missing ones take their
            defaults.
        script: the worker script (e.g. "train.py"), started with `python -u` on each rank.
        user_args: passed to the script unchanged (an opaque list, e.g. the config bundle).
            Under pdsh they cross a remote shell and must be shell-safe (base64 is).
        python: the interpreter that runs the runner (the runner starts workers with its own
            `sys.executable`).
        device_count: GPUs on this machine (None: ask torch); only used without a hostfile.
        forward_env: names of variables that must reach remote ranks by name only (OpenMPI
            `-x NAME`); see `megatron.launcher.launch.prepare_launch`.
        env_script: a file every pdsh node sources before starting (`--venv_script`).
        log_level: the runner's `--log_level` (see megatron.config.verbosity); None: the
            runner's default (info).

    Raises:
        LauncherError: a setting, the hostfile or an argument that cannot work, naming the
            key, file and line, and what is valid.
    """
    plan = plan_resources(launcher, device_count=device_count)
    return runner_argv_for_plan(
        plan,
        script,
        user_args,
        python=python,
        forward_env=forward_env,
        env_script=env_script,
        log_level=log_level,
    )


def runner_argv_for_plan(
    plan: LaunchResources,
    script: str,
    user_args: Sequence[str],
    *,
    python: str = sys.executable,
    forward_env: Sequence[str] = (),
    env_script: str | None = None,
    log_level: str | None = None,
) -> list[str]:
    """`build_runner_argv` for an already resolved plan (see there)."""
    if not script:
        raise LauncherError("the worker script path is empty; pass e.g. 'train.py'")
    if plan.hostfile is None and plan.hostfile_text is not None:
        raise LauncherError("this plan needs its hostfile written first; use prepare_launch")
    settings = plan.settings
    backend = BACKENDS[settings.launcher]
    user_args = [str(arg) for arg in user_args]
    backend.check(plan, script, user_args)

    argv = [python, "-m", RUNNER_MODULE]
    if plan.hostfile is not None:
        argv += ["--hostfile", plan.hostfile]
    if settings.include:
        argv += ["--include", settings.include]
    if settings.exclude:
        argv += ["--exclude", settings.exclude]
    if settings.num_nodes > 0:
        argv += ["--num_nodes", str(settings.num_nodes)]
    if plan.num_gpus is not None:
        argv += ["--num_gpus", str(plan.num_gpus)]
    master_addr = plan.node.master_addr if plan.node else backend.master_addr(plan)
    if master_addr:
        argv += ["--master_addr", master_addr]
    port = plan.node.master_port if plan.node else settings.master_port
    argv += ["--master_port", str(port), "--launcher", settings.launcher]
    launcher_args = join_launcher_args(
        backend.launcher_words(plan, forward_env), settings.launcher_args
    )
    if launcher_args:
        argv += ["--launcher_args", launcher_args]
    if settings.launcher != "pdsh" or settings.force_multi:
        argv.append("--force_multi")  # else one host silently becomes a local launch
    if settings.no_ssh_check or not backend.uses_ssh:
        argv.append("--no_ssh_check")
    if plan.node is not None:
        argv += ["--no_ssh", "--node_rank", str(plan.node.node_rank)]
    argv += backend.extra_flags(plan, env_script)
    if log_level:
        argv += ["--log_level", log_level]
    argv += ["--no_local_rank", script, *user_args]
    return argv
