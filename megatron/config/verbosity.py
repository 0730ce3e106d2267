"""How much a worker prints: a quiet console by default, DeepSpeed's news with `--verbose`.

Quiet (the default) shows our own lines (start-up report, one line per log interval,
evaluations, checkpoints, the final summary) and every warning and error. `deepy.py --verbose`
adds the INFO lines of the DeepSpeed runner and its `launch.py` (the runner's `--log_level`, see
megatron/launcher/launch.py) and, on every worker, those of the engine and what DeepSpeed
`print`s.

The flag travels on the worker command line after the config bundle (`VERBOSE_FLAG`), the one
channel that reaches workers under every launcher. `setup_worker_logging(argv)`, at the top of
train.py, generate.py and eval.py, sets the root logger's level from it; `quiet_deepspeed()`
and `sync_deepspeed_logger()` follow that level, and so does what DeepSpeed prints while it
trains: its progress line every `steps_per_print` steps (the exported config's,
megatron/config/ds_export.py) and its `wall_clock_breakdown` timers (`EngineTimers`,
megatron/training/loop/callbacks.py). Neither torch nor DeepSpeed is imported here.
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
    a CPU communication op built, the bf16 optimizer's memory use as it is built, the
    checkpoint loader's `_load_legacy_checkpoint ...`) unless INFO lines are shown: it is
    INFO-level news that does not go through logging. Warnings (logging, stderr) still come
    through."""
    if verbose_logging():
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def quiet_transformers() -> None:
    """Switch off transformers' progress bars ("Writing model shards", "Loading weights") for
    the Hugging Face conversion tools, whose own lines say what was read and written. Call
    once transformers is known to be installed."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
