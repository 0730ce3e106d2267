"""How much a run prints: a quiet console by default, DeepSpeed's news with `deepy.py --verbose`.

Quiet (the default) shows our own lines (start-up report, one line per log interval, evaluations,
checkpoints, the final summary) and every warning and error. `--verbose` adds the INFO lines of
the DeepSpeed runner, of its per-node `launch.py` and of the engine on every worker, including
the worker command lines with their config bundle, and the news DeepSpeed `print`s.

The choice travels on every launcher backend the same way:

* runner and local `launch.py`: the runner's `--log_level` (`runner_log_level`), which it
  hands on to `launch.py`;
* workers: `VERBOSE_FLAG` after the config bundle on the worker command line, read by
  `setup_worker_logging(argv)` at the top of train.py, generate.py and eval.py, which sets the
  level of the root logger; `quiet_deepspeed()` follows that level.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator, Sequence

VERBOSE_FLAG = "--verbose"
DEEPSPEED_LOGGER = "DeepSpeed"  # deepspeed.utils.logging's logger (it does not propagate)
WORKER_FORMAT = "%(name)s: %(levelname)s: %(message)s"


def runner_log_level(verbose: bool) -> str:
    """The DeepSpeed runner's `--log_level`: its INFO lines (the worker commands) only if asked."""
    return "info" if verbose else "warning"


def worker_args(verbose: bool) -> list[str]:
    """What to append to a worker's command line for this verbosity."""
    return [VERBOSE_FLAG] if verbose else []


def setup_worker_logging(argv: Sequence[str] | None = None) -> bool:
    """Configure a worker's logging from its command line; return whether it is verbose."""
    verbose = VERBOSE_FLAG in (sys.argv[1:] if argv is None else argv)
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format=WORKER_FORMAT, stream=sys.stderr)
    logging.getLogger().setLevel(level)
    return verbose


def verbose_logging() -> bool:
    """Whether this process shows INFO lines (a worker started with `--verbose`)."""
    return logging.getLogger().isEnabledFor(logging.INFO)


def sync_deepspeed_logger() -> None:
    """Give DeepSpeed's logger our level (INFO when verbose, else WARNING).

    Call after `import deepspeed`: the import creates the logger and sets its level.
    """
    level = logging.INFO if verbose_logging() else logging.WARNING
    logger = logging.getLogger(DEEPSPEED_LOGGER)
    logger.setLevel(level)
    for handler in logger.handlers:
        handler.setLevel(level)


@contextlib.contextmanager
def quiet_deepspeed() -> Iterator[None]:
    """Hide what DeepSpeed `print`s inside the block (the pipeline partition, the topology,
    a CPU communication op built) unless INFO lines are shown: it is INFO-level news that
    does not go through logging. Warnings (logging, stderr) still come through."""
    if verbose_logging():
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield
