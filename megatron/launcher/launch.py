"""Launcher side: everything `deepy.py` needs to start the runner safely, in one call.

    with prepare_launch(cfg.launcher, "train.py", ["--megatron_config", bundle]) as plan:
        print(plan.display())               # the runner command, secrets redacted
        returncode = run_launch(plan)       # blocks until every worker has exited

Quiet by default: the runner logs only CRITICAL lines (its INFO lines carry the worker
commands and their config bundle, and its one ERROR line, when a worker fails, that worker's
whole command: `run_launch` says what failed instead); `verbose=True` passes its INFO lines
and `--verbose` to the workers (see megatron/config/verbosity.py).

With `collect_errors=True` (deepy.py) the launch gets a fresh folder where a failing worker
records its error (megatron/launcher/failures.py); `run_launch` prints each user error once,
with the ranks, and where the tracebacks are when a bug is among them; the folder is removed
when it stays empty or holds user errors only.
A multi-node launch with `preflight_shared_fs: false` gets none: its workers print their
errors themselves.

A launch whose ranks run on this machine (a local launch.py: one host, or a `no_ssh` node) is
stopped by deepy.py itself on a Ctrl-C or a SIGTERM: every rank saves and exits, a second
Ctrl-C kills the run, and `run_launch` says which checkpoint was saved
(megatron/launcher/stopping.py).

`prepare_launch` resolves the hosts (`plan.world_size`), builds the runner argv and the
runner's environment. With `launcher: slurm`, no hostfile and a multi-node allocation
(SLURM_JOB_NODELIST), it writes a hostfile of the allocation's nodes for the runner; with
`no_ssh: true` and no hostfile, one of the NNODES nodes (megatron.launcher.nossh), and the
launch starts only this node's ranks (`plan.describe()` says which).

For a local launch the environment is passed through unchanged. For a multi-node launch,
variables that look secret (`is_secret_name`) are removed from
the runner's environment and written to a private file (see megatron.launcher.secrets),
which the context manager deletes on exit; the `CARRIED` variables (PATH, the virtual
environment, ...) go to remote ranks with the launching shell's values. On a machine without
GPUs, a local launch (or a `no_ssh` node's) also gets DS_ACCELERATOR=cpu so the runner and
workers do not probe for accelerators.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from megatron.config.verbosity import VERBOSE_FLAG
from megatron.launcher.failures import (
    ERRORS_DIR_FLAG,
    any_bug,
    exit_status,
    failure_report,
    read_failures,
)
from megatron.launcher.plan import LaunchResources, local_device_count, plan_resources
from megatron.launcher.runner import runner_argv_for_plan
from megatron.launcher.runner_process import run_local_runner, run_runner
from megatron.launcher.secrets import (
    SECRETS_FILE_VAR,
    carried_names,
    check_deepspeed_env_files,
    redact_argv,
    secret_names,
    write_secrets_file,
)
from megatron.launcher.stopping import RunCheckpoints, announce_stop, interrupt_report

DEFAULT_LAUNCH_DIR = ".megatron_launch"


@dataclass(frozen=True)
class StagedFile:
    """A worker argument too long for a command line (Linux takes at most 128 KiB in one
    argument, and pdsh and srun carry the whole command through a remote shell): `prepare_launch`
    writes `text` to a private file in the launch folder, which every node sees, passes its path
    in its place and deletes it when the launch ends."""

    prefix: str
    text: str = field(repr=False)


@dataclass
class LaunchPlan:
    """A ready launch: run `argv` with `env` (e.g. `run_launch(plan)`)."""

    argv: list[str]
    """The runner command line; holds no secret values."""
    env: dict[str, str]
    """The runner's environment."""
    resources: LaunchResources
    """Hosts and slots; `resources.world_size` is the number of workers."""
    secrets_file: str | None = None
    """The file holding forwarded secrets (multi-node only); deleted when the launch ends."""
    forwarded_secrets: list[str] = field(default_factory=list)
    """Names of the secret variables sent through `secrets_file`."""
    extra_secret_names: tuple[str, ...] = ()
    """Variables treated as secrets besides the `is_secret_name` matches."""
    secret_values: dict[str, str] = field(default_factory=dict, repr=False)
    """The secret variables of the original environment, to redact from `display()`."""
    errors_dir: str | None = None
    """Where failing workers record their errors (`collect_errors`); None: they print them."""
    verbose: bool = False
    """Whether the workers got `--verbose` (the report then shows the tracebacks)."""

    @property
    def world_size(self) -> int:
        return self.resources.world_size

    def describe(self) -> str:
        """What this launch starts, for the console: "4 rank(s)", or a no_ssh node's share."""
        node = self.resources.node
        if node is None:
            return f"{self.world_size} rank(s)"
        slots = self.resources.resources[self.resources.hosts[node.node_rank]]
        first = sum(len(s) for s in list(self.resources.resources.values())[: node.node_rank])
        return f"ranks {first}-{first + len(slots) - 1} of {self.world_size} ({node.describe()})"

    def display(self) -> str:
        """The runner command as one shell line, safe to print or log."""
        environ = {**self.env, **self.secret_values}
        return shlex.join(redact_argv(self.argv, environ, self.extra_secret_names))


@contextmanager
def prepare_launch(
    launcher: object,
    script: str,
    user_args: Sequence[str | StagedFile],
    *,
    environ: Mapping[str, str] | None = None,
    python: str = sys.executable,
    launch_dir: str | None = None,
    extra_secret_names: Iterable[str] = (),
    device_count: int | None = None,
    verbose: bool = False,
    collect_errors: bool = False,
) -> Iterator[LaunchPlan]:
    """Resolve, validate and stage a launch; clean up its files on exit.

    Args:
        launcher: `cfg.launcher` (see `build_runner_argv` for the keys).
        script, user_args: the worker script and its arguments (e.g. the config bundle); a
            `StagedFile` among them is written under `launch_dir` and passed as its path.
        environ: the environment to start from (default `os.environ`); not modified.
        python: interpreter for the runner.
        launch_dir: where a multi-node launch writes its secrets file (and a hostfile made
            from a SLURM allocation); it must be on a filesystem every node sees (default:
            `.megatron_launch/` in the working directory, which the pdsh backend already
            requires to be shared).
        extra_secret_names: variables to treat as secrets besides `is_secret_name` matches.
        device_count: GPUs on this machine (None: ask torch).
        verbose: show DeepSpeed's INFO lines (runner, launch.py, workers); default: warnings
            and errors only.
        collect_errors: give the workers a folder (under `launch_dir`) to record their
            errors in, for `run_launch` to report (see megatron/launcher/failures.py).

    Raises:
        LauncherError: a bad setting, hostfile or argument, before anything starts.
    """
    environ = dict(os.environ if environ is None else environ)
    extra = tuple(extra_secret_names)
    resources = plan_resources(launcher, device_count=device_count, environ=environ)
    directory = launch_dir or os.path.join(os.getcwd(), DEFAULT_LAUNCH_DIR)
    env = dict(environ)
    staged: list[str] = []  # files to delete when the launch ends, or fails to start
    errors_dir: str | None = None
    try:
        if resources.hostfile_text is not None:
            path = _write_private(directory, "hostfile-", resources.hostfile_text)
            staged.append(path)
            resources = dataclasses.replace(resources, hostfile=path)
        secrets_file = None
        forwarded: list[str] = []
        carried: list[str] = []  # by name: the backends that carry no whole environment
        if resources.multi_node:
            check_deepspeed_env_files(environ, extra=extra)
            forwarded = secret_names(environ, extra)
            carried = carried_names(environ, extra)
        sourced = forwarded + (carried if resources.settings.launcher == "pdsh" else [])
        if sourced:
            secrets_file = write_secrets_file({n: environ[n] for n in sourced}, directory)
            staged.append(secrets_file)
            for name in forwarded:
                del env[name]
            env[SECRETS_FILE_VAR] = secrets_file
        this_machine = resources.hostfile is None or resources.node is not None
        if not resources.multi_node and this_machine and _no_gpu(device_count):
            env.setdefault("DS_ACCELERATOR", "cpu")
        if collect_errors and _sees_worker_files(launcher, resources):
            errors_dir = _make_private_dir(directory, "errors-")
        worker_args = [_staged(a, directory, staged) for a in user_args]
        worker_args += [ERRORS_DIR_FLAG, errors_dir] if errors_dir else []
        argv = runner_argv_for_plan(
            resources,
            script,
            [*worker_args, *([VERBOSE_FLAG] if verbose else [])],
            python=python,
            forward_env=([SECRETS_FILE_VAR] if secrets_file else [])
            + (carried if resources.settings.launcher == "openmpi" else []),
            env_script=secrets_file,
            log_level="info" if verbose else "critical",  # INFO: the worker commands
        )
        secret_values = {name: environ[name] for name in secret_names(environ, extra)}
        yield LaunchPlan(
            argv, env, resources, secrets_file, forwarded, extra, secret_values,
            errors_dir=errors_dir, verbose=verbose,
        )  # fmt: skip
    finally:
        for path in staged:
            if os.path.exists(path):
                os.remove(path)
        if errors_dir and os.path.isdir(errors_dir) and not os.listdir(errors_dir):
            os.rmdir(errors_dir)


def _sees_worker_files(launcher: object, resources: LaunchResources) -> bool:
    """Whether this machine reads what the workers write (always, for a local launch)."""
    if isinstance(launcher, Mapping):
        shared = launcher.get("preflight_shared_fs", True)
    else:
        shared = getattr(launcher, "preflight_shared_fs", True)
    return not resources.multi_node or shared is not False


def _make_private_dir(directory: str, prefix: str) -> str:
    """A new folder only this user can read; return its absolute path."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return os.path.abspath(tempfile.mkdtemp(prefix=prefix, dir=directory))


def _staged(arg: str | StagedFile, directory: str, staged: list[str]) -> str:
    if not isinstance(arg, StagedFile):
        return arg
    staged.append(_write_private(directory, arg.prefix, arg.text))
    return staged[-1]


def _write_private(directory: str, prefix: str, text: str) -> str:
    """Write `text` to a new file only this user can read; return its absolute path."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=prefix, dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return os.path.abspath(path)


def run_launch(plan: LaunchPlan, checkpoints: RunCheckpoints | None = None) -> int:
    """Run the runner in the foreground; report a failure or a stop; return the exit status.

    0: every worker succeeded, or stopped cleanly on a Ctrl-C or SIGTERM (a launch whose ranks
    run here: megatron/launcher/stopping.py); `USER_ERROR_EXIT` (2): workers stopped on a user
    error, whose message is printed once; `INTERRUPTED_EXIT` (130): stopped without saving
    (a second Ctrl-C); else the runner's status. `checkpoints`, for a run that saves them: a
    stop then says it saves, and which checkpoint it saved.
    """
    before = checkpoints.latest() if checkpoints else None
    status, stop = _run_runner(plan, saves=checkpoints is not None)
    if status == 0 and stop is None:
        return 0
    failures = read_failures(plan.errors_dir) if plan.errors_dir else []
    report = None
    if stop is not None:
        after = checkpoints.latest() if checkpoints else None
        report = interrupt_report(stop, status, failures, before, after, checkpoints)
    lines, code = report or _failure_lines(plan, failures, status)
    for line in lines:
        print(f"deepy.py: {line}", file=sys.stderr, flush=True)
    if plan.errors_dir and not any_bug(failures):  # their messages were all there is to say
        shutil.rmtree(plan.errors_dir, ignore_errors=True)
    return code


def _run_runner(plan: LaunchPlan, saves: bool) -> tuple[int, str | None]:
    """(the runner's exit status, how a stop went: None, REQUESTED or FORCED)."""
    if plan.resources.multi_node:
        remote = plan.resources.settings.launcher == "pdsh"
        return run_runner(plan.argv, plan.env, quiet_remote=remote and not plan.verbose), None
    ended = run_local_runner(plan.argv, plan.env, functools.partial(announce_stop, saves=saves))
    return ended.status, ended.stop


def _failure_lines(plan: LaunchPlan, failures, status: int) -> tuple[list[str], int]:
    """What a failed run's report says, and deepy.py's exit status."""
    lines = failure_report(failures, plan.errors_dir or "", plan.verbose)
    if not lines:
        lines = [f"the run failed (runner exit status {status}; see the output above)"]
    return lines, exit_status(failures, status)


def _no_gpu(device_count: int | None) -> bool:
    return (local_device_count() if device_count is None else device_count) == 0
