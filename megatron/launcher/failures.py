"""How a worker's failure travels back to `deepy.py`: one record per failed rank in a folder.

`prepare_launch(..., collect_errors=True)` makes a fresh folder for the launch and passes it
to every worker after the config bundle (`ERRORS_DIR_FLAG`, the one channel that reaches
workers under every launcher). A worker that stops on an exception (`megatron/errors.py`)
writes `rank{N}.json` (`Failure`) and `rank{N}.traceback.txt` there; `run_launch` then reads
the records (`read_failures`) and prints `failure_report`: each distinct user error once,
with the ranks that hit it, and its message alone (its traceback too with `--verbose`); where
the tracebacks are only when a bug is among the failures (else the folder is removed: the
messages said everything).

Three kinds of record:

* `USER`: a mistake in the input (bad data, checkpoint, tokenizer, a refused combination);
  the worker prints nothing, `deepy.py` prints the message and exits with `USER_ERROR_EXIT`.
* `BUG`: any other exception; the worker prints its traceback on the console as usual.
* `COLLATERAL`: an exception on a rank after another rank had already recorded a failure
  (typically a collective broken because that rank exited); printed by nobody, since it
  would only bury the first failure. `read_failures` also counts as collateral a rank's
  lost contact with a peer (`LOST_PEER`) when some other rank recorded a failure of its own:
  the peer went because of that failure, whichever rank's record reached the folder first.

Without the folder (a multi-node launch whose launching machine does not see the workers'
file system, `preflight_shared_fs: false`), each worker prints `rank N: <message>` itself.
Neither torch nor DeepSpeed is imported here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ERRORS_DIR_FLAG = "--errors_dir"
USER_ERROR_EXIT = 2  # the status deepy.py gives a config refused before launch, too
USER, BUG, COLLATERAL = "user", "bug", "collateral"
LOST_PEER = "LostPeerError"  # the error of megatron/launcher/peers.py, named (torch not imported)


@dataclass(frozen=True)
class Failure:
    """What one rank recorded when it stopped on an exception."""

    rank: int | None
    """The global rank (None: it failed before it knew its rank)."""
    kind: str
    """`USER`, `BUG` or `COLLATERAL`."""
    error: str
    """The exception's class name."""
    message: str
    """`str(exception)`."""
    traceback_file: str
    """The file holding the full traceback."""

    def name(self) -> str:
        return f"rank{self.rank}" if self.rank is not None else f"pid{os.getpid()}"


def errors_dir_from_argv(argv: Sequence[str]) -> str | None:
    """The folder after `ERRORS_DIR_FLAG` on a worker's command line, if any."""
    argv = list(argv)
    if ERRORS_DIR_FLAG in argv[:-1]:
        return argv[argv.index(ERRORS_DIR_FLAG) + 1]
    return None


def any_failure_recorded(folder: str) -> bool:
    """Whether some rank has already written its record into `folder`."""
    return any(Path(folder).glob("*.json"))


def write_failure(folder: str, failure: Failure, traceback_text: str) -> Failure:
    """Write the traceback, then the record (so a record always names a complete file)."""
    base = Path(folder) / failure.name()
    trace = base.with_suffix(".traceback.txt")
    trace.write_text(traceback_text, encoding="utf-8")
    failure = Failure(**{**asdict(failure), "traceback_file": str(trace)})
    partial = base.with_suffix(".json.partial")
    partial.write_text(json.dumps(asdict(failure)), encoding="utf-8")
    os.replace(partial, base.with_suffix(".json"))
    return failure


def read_failures(folder: str) -> list[Failure]:
    """Every record in `folder`, by rank; a lost peer is collateral beside another failure."""
    records = [Failure(**json.loads(p.read_text())) for p in Path(folder).glob("*.json")]
    if any(f.kind != COLLATERAL and f.error != LOST_PEER for f in records):
        records = [
            Failure(**{**asdict(f), "kind": COLLATERAL}) if f.error == LOST_PEER else f
            for f in records
        ]
    return sorted(records, key=lambda f: (f.rank is None, f.rank or 0))


def rank_ranges(ranks: Sequence[int | None]) -> str:
    """`[0, 1, 2, 3, 6]` -> "ranks 0-3, 6"; one rank -> "rank 2"."""
    known = sorted({r for r in ranks if r is not None})
    spans: list[list[int]] = []
    for rank in known:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    words = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    words += ["?"] * (len(ranks) - len([r for r in ranks if r is not None]))
    return ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(words)


def failure_report(failures: Sequence[Failure], folder: str, verbose: bool) -> list[str]:
    """The lines `deepy.py` prints for the records of a failed launch (empty: none)."""
    lines: list[str] = []
    by_message: dict[tuple[str, str], list[Failure]] = {}
    for failure in failures:
        if failure.kind == USER:
            by_message.setdefault((failure.error, failure.message), []).append(failure)
    for (_, message), group in by_message.items():
        if verbose:
            lines.append(Path(group[0].traceback_file).read_text(encoding="utf-8").rstrip())
        lines.append(f"error on {rank_ranges([f.rank for f in group])}: {message}")
    bugs = [f for f in failures if f.kind == BUG]
    if bugs:
        lines.append(f"{rank_ranges([f.rank for f in bugs])} failed (traceback above)")
    others = [f for f in failures if f.kind == COLLATERAL]
    if others:
        lines.append(f"{rank_ranges([f.rank for f in others])} stopped after that failure")
    if bugs:
        more = "" if verbose else " (or run again with --verbose)"
        lines.append(f"tracebacks: {folder}{more}")
    return lines


def any_bug(failures: Sequence[Failure]) -> bool:
    """Whether a bug is among the records (their folder is then worth keeping)."""
    return any(f.kind == BUG for f in failures)


def exit_status(failures: Sequence[Failure], runner_status: int) -> int:
    """`USER_ERROR_EXIT` when only user errors (and their collateral) stopped the run; with a
    bug among them never that status, whichever rank's status the runner passed on (a rank
    that lost its peer to the bug exits with `USER_ERROR_EXIT`)."""
    kinds = {f.kind for f in failures}
    if runner_status != 0 and USER in kinds and BUG not in kinds:
        return USER_ERROR_EXIT
    if BUG in kinds and runner_status in (0, USER_ERROR_EXIT):
        return 1
    return runner_status
