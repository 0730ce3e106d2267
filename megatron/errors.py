"""What a user error is, and how a worker entry point or a command-line tool stops on one.

A user error is a mistake in what the person gave us (a config value, a data file, a
checkpoint, a tokenizer, a combination the code refuses), as opposed to a bug in our code.
By the house rule such mistakes raise a `ValueError` subclass with a message that names the
file, key or value; `is_user_error` is the one definition:

* an instance of a `ValueError` subclass defined in the `megatron` package (`ConfigError`,
  `LauncherError`, `CheckpointError`, `UnsafeCheckpointError`, `IndexedDatasetError`,
  `TokenizerError`, ...), or
* one of `USER_SITUATIONS`: the run stopping for a reason in the person's world that its
  message says in full, not a bug (a diverged run, `TooManySkippedSteps`; a full disk or a
  file in the way of a checkpoint, `CheckpointSaveError`; a node or rank that died under a
  collective, which `run_worker` turns into a `LostPeerError` naming it), or
* a `ValueError` or `OSError` raised by a `raise` statement of our code, the `megatron`
  package or the command-line tools in `tools/` (a `raise ValueError(...)` naming a refused
  combination, a `raise FileNotFoundError(...)` naming a missing data file). The same class
  raised by Python itself inside our code (an unpacking of the wrong length) or by a library
  is a bug, and keeps its traceback.

A user error ends with its message alone (its traceback goes to the launch's errors folder,
printed with `--verbose`); only a bug shows a traceback by default.

`run_worker(main)` wraps the `main` of `train.py`, `generate.py` and `eval.py` (see
megatron/launcher/failures.py for where the record goes and what `deepy.py` prints);
`run_tool(main)` the `main` of every `tools/*.py`. This module is outside the rooms (it reads
classes of several); only the entry points import it.
"""

from __future__ import annotations

import atexit
import dis
import inspect
import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from megatron.config.verbosity import VERBOSE_FLAG
from megatron.launcher.failures import (
    BUG,
    COLLATERAL,
    USER,
    USER_ERROR_EXIT,
    Failure,
    any_failure_recorded,
    errors_dir_from_argv,
    write_failure,
)
from megatron.launcher.peers import lost_peer_error
from megatron.launcher.stopping import take_sigterm

PACKAGE = Path(__file__).resolve().parent
OUR_CODE = (PACKAGE, PACKAGE.parent / "tools")  # the package and the tools run from a checkout
RAISE = dis.opmap["RAISE_VARARGS"]
USER_SITUATIONS = (  # (module, class): looked up only once loaded, since never raised before
    ("megatron.launcher.peers", "LostPeerError"),
    ("megatron.training.step.loss_scaling", "TooManySkippedSteps"),
    ("megatron.training.checkpoint.disk_space", "CheckpointSaveError"),
)


def is_user_error(error: BaseException) -> bool:
    """Whether `error` is a mistake in the user's input rather than a bug (module docstring)."""
    for module, name in USER_SITUATIONS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(error, getattr(loaded, name)):
            return True
    if isinstance(error, ValueError) and type(error).__module__.startswith("megatron."):
        return True
    return isinstance(error, ValueError | OSError) and _raised_by_our_raise(error)


def _raised_by_our_raise(error: BaseException) -> bool:
    """True when the innermost frame is in `OUR_CODE`, stopped at a `raise`."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    path = Path(code.co_filename).resolve()
    if not any(path.is_relative_to(ours) for ours in OUR_CODE):
        return False
    return 0 <= tb.tb_lasti < len(code.co_code) and code.co_code[tb.tb_lasti] == RAISE


def current_rank() -> int | None:
    """This worker's global rank: the process group's, else the launcher's RANK, else None."""
    torch_dist = sys.modules.get("torch.distributed")
    if torch_dist is not None and torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_rank()
    rank = os.environ.get("RANK", "")
    return int(rank) if rank.isdigit() else None


def run_tool(
    main: Callable[[list[str] | None], int],
    argv: Sequence[str] | None = None,
    *,
    status: int = USER_ERROR_EXIT,
    label: str = "",
) -> int:
    """Run a command-line tool's `main(argv)` and return its exit status: what `main` returns,
    or, on a user error, `status` after one line on stderr, `{label}: {message}` (`label`: the
    file name of the tool's `main` unless given). A bug keeps its traceback.

    A tool calls it around its whole `main` (`sys.exit(run_tool(main))`), or inside its `main`
    where callers read the status `main` returns.
    """
    try:
        return main(None if argv is None else list(argv))
    except Exception as error:
        if not is_user_error(error):
            raise
        print(f"{label or Path(inspect.getfile(main)).name}: {error}", file=sys.stderr)
        return status


def run_worker(
    main: Callable[[list[str] | None], object], argv: Sequence[str] | None = None
) -> NoReturn:
    """Run a worker's `main(argv)` and exit: 0 when it returns (`_exit_finished`), else as
    megatron/launcher/failures.py says.

    A user error exits with `USER_ERROR_EXIT`; any other exception with status 1. The exit
    skips the interpreter's clean-up (`os._exit`): with a process group whose peers are gone,
    torch's clean-up can block, and DeepSpeed's launcher stops the other ranks only once this
    one has exited. What must reach disk is written by then (the loggers close as the
    exception leaves `pretrain`, the record here).
    """
    take_sigterm()  # blocked by deepy.py for the runner: the rank's own stop signal
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        main(argv)
    except Exception as error:  # noqa: BLE001 - every failure is recorded and reported
        error = lost_peer_error(error) or error  # a dead node: the cluster's, not a bug
        code = USER_ERROR_EXIT if is_user_error(error) else 1
        try:
            _stop(error, argv, code)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _close_process_group()
    _exit_finished()


def _close_process_group() -> None:
    """Tear the process group down before the interpreter exits."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _exit_finished() -> None:
    """Exit 0 after a finished run without the interpreter's teardown of C++ objects.

    Left to the interpreter, a finished 2-rank CPU run sometimes ended with `terminate called
    without an active exception` (SIGABRT, which DeepSpeed's launcher reports as status 250):
    a native thread (communication, data loading) still joinable when its owner is destroyed
    at exit, after everything the run writes was written. So Python's own exit handlers run
    (logging's flush, the loggers' `atexit` hooks), the streams are flushed, and the process
    ends without destroying the rest. Child processes still running (data-loader workers,
    which ignore SIGTERM: megatron/data/data_loaders.py) are killed first: multiprocessing's
    exit handler would SIGTERM them and wait forever. (torch's SIGCHLD handler, which would
    take a killed loader worker for a failed one, goes first.)"""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=10)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _stop(error: Exception, argv: list[str], code: int) -> None:
    """Record `error` for deepy.py, or print it, according to its kind."""
    rank, folder = current_rank(), errors_dir_from_argv(argv)
    text = "".join(traceback.format_exception(error))
    user = code == USER_ERROR_EXIT
    if folder is None or not os.path.isdir(folder):
        if user:  # nobody collects records: say it here, once per rank
            if VERBOSE_FLAG in argv:
                print(text, end="", file=sys.stderr)
            print(f"rank {'?' if rank is None else rank}: {error}", file=sys.stderr, flush=True)
        else:
            print(text, end="", file=sys.stderr, flush=True)
        return
    kind = USER if user else (COLLATERAL if any_failure_recorded(folder) else BUG)
    write_failure(folder, Failure(rank, kind, type(error).__name__, str(error), ""), text)
    if kind == BUG:
        print(text, end="", file=sys.stderr, flush=True)
