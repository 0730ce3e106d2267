"""Build the DeepSpeed ops this trainer loads, once, at install (docs/getting-started.md).

    python tools/build_deepspeed_ops.py            # no-op when they are built already
    python tools/build_deepspeed_ops.py --check    # exit 1 and name them when any is missing

Without it, DeepSpeed compiles them in the first worker that needs one (on a CPU, its
shared-memory all-reduce: about 80 s before the first step), under a lock file that a killed
run leaves behind. This reinstalls the installed DeepSpeed version from its source with
`DS_BUILD_<OP>=1` for the ops of `megatron/kernels/deepspeed_ops.py`, against the torch of
this environment (`--no-build-isolation`; no other package changes), and checks the result.

The build takes minutes (7 to 8 on two CPU cores: setuptools compiles one source file at a
time), and pip shows nothing of it but a spinner, or thousands of lines with `-v`. So pip runs
verbosely into a pipe, and `BuildProgress` turns its output into a line per step (fetching
the source, each op and each of its source files as the compiler starts on it, installing)
with the time since the start, and a "still ..." line after a minute without one.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.errors import run_tool  # noqa: E402
from megatron.kernels.deepspeed_ops import (  # noqa: E402
    BUILD_VARS,
    OPS_BY_ACCELERATOR,
    accelerator,
    missing_ops,
)

HEARTBEAT_S = 60.0  # a "still ..." line after this long without a progress line
POLL_S = 5.0  # how often a silent pip is checked on
TAIL_LINES, TAIL_CHARS = 200, 6000  # of pip's output, in the error when the build fails
# the lines of pip's verbose output that begin a step of the build, and what the step does
STEPS = (
    (re.compile(r"^Collecting deepspeed"), "fetching DeepSpeed's source"),
    (re.compile(r"^Preparing metadata .*: started"), "reading DeepSpeed's setup"),
    (re.compile(r"^Building wheel for deepspeed .*: started"), "building DeepSpeed"),
    (re.compile(r"^running install$"), "packing the rebuilt DeepSpeed"),
    (re.compile(r"^Installing collected packages"), "installing the rebuilt DeepSpeed"),
)
EXTENSION = re.compile(r"^building '(?:[\w.]*\.)?(\w+?)(?:_op)?' extension")  # one per op
COMPILE = re.compile(r" -c (\S+\.(?:cpp|cu|c))(?:\s|$)")  # as the compiler starts on a file
SAY = functools.partial(print, flush=True)  # under make, whose stdout is a pipe


def elapsed(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


class BuildProgress:
    """What pip's verbose output (`line` by line) says the build is doing, in a few lines: one
    per step and per source file of an op compiled, and a "still ..." line when there has been
    none for `heartbeat_s` (`tick`), each after the time since the start (`m:ss`)."""

    def __init__(
        self,
        ops: list[str],
        say: Callable[[str], None] = SAY,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_s: float = HEARTBEAT_S,
    ):
        self.ops, self.say, self.clock, self.heartbeat_s = ops, say, clock, heartbeat_s
        self.start = self.last_said = clock()
        self.doing = "starting pip"
        self.op: str | None = None
        self.ops_started = 0

    def _now(self, doing: str) -> None:
        self.doing = doing
        self._say(doing)

    def _say(self, text: str) -> None:
        self.last_said = self.clock()
        self.say(f"  {elapsed(self.last_said - self.start)} {text}")

    def line(self, text: str) -> None:
        """One line of pip's output."""
        text = text.strip()
        extension, source = EXTENSION.match(text), COMPILE.search(text)
        if extension:  # its source files come next
            self.ops_started += 1
            self.op = f"{extension.group(1)} (op {self.ops_started} of {len(self.ops)})"
            self.doing = f"compiling {self.op}"
        elif source and self.op:
            self._now(f"compiling {self.op}: {source.group(1)}")
        else:
            for pattern, doing in STEPS:
                if pattern.search(text):
                    self._now(doing)
        self.tick()

    def tick(self) -> None:
        """Time passes: after `heartbeat_s` without a line, say what is still going on."""
        if self.clock() - self.last_said >= self.heartbeat_s:
            self._say(f"still {self.doing}")


def _forward(lines: Iterable[str], into: queue.Queue) -> None:
    for line in lines:
        into.put(line)
    into.put(None)


def run_watched(argv: list[str], env: dict[str, str], progress: BuildProgress, poll_s=POLL_S):
    """Run `argv` with its output (stdout and stderr) read line by line into `progress`, which
    also hears from a silent process every `poll_s`; return its exit status and the end of its
    output."""
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace",
    )  # fmt: skip
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_forward, args=(proc.stdout, lines), daemon=True).start()
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    while True:
        try:
            line = lines.get(timeout=poll_s)
        except queue.Empty:
            progress.tick()
            continue
        if line is None:
            return proc.wait(), "".join(tail)[-TAIL_CHARS:]
        tail.append(line)
        progress.line(line)


class OpBuildError(ValueError):
    """DeepSpeed could not be rebuilt with its ops (the pip output says why)."""


def rebuild(ops: list[str], kind: str) -> None:
    """Reinstall the installed DeepSpeed version from source with `ops` built, saying how the
    build goes (`BuildProgress`)."""
    from deepspeed import __version__

    env = {**os.environ, "DS_ACCELERATOR": kind, **{BUILD_VARS[op]: "1" for op in ops}}
    argv = [
        sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps",
        "--no-binary", "deepspeed", "--no-cache-dir", "--force-reinstall",
        f"deepspeed=={__version__}",
    ]  # fmt: skip
    status, output = run_watched(argv, env, BuildProgress(ops))
    if status != 0:
        raise OpBuildError(
            f"pip could not rebuild DeepSpeed {__version__} with {', '.join(ops)} "
            f"(exit status {status}):\n{output}"
        )


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say what is missing")
    args = parser.parse_args(argv)
    kind = accelerator()
    os.environ.setdefault("DS_ACCELERATOR", kind)  # DeepSpeed then need not guess it
    wanted = OPS_BY_ACCELERATOR.get(kind, ())
    missing = missing_ops(kind)
    if not missing:
        print(f"DeepSpeed ops for {kind}: {', '.join(wanted) or 'none needed'}, all built")
        return 0
    if args.check:
        print(f"DeepSpeed ops for {kind} not built: {', '.join(missing)}", file=sys.stderr)
        return 1
    print(
        f"building DeepSpeed's {', '.join(missing)} for {kind}: pip reinstalls DeepSpeed from "
        "its source (7 to 8 minutes on two CPU cores)",
        flush=True,
    )
    started = time.monotonic()
    rebuild(list(wanted), kind)
    still = subprocess.run(  # a new process: this one has the old DeepSpeed imported
        [sys.executable, __file__, "--check"], capture_output=True, text=True
    )
    if still.returncode != 0:
        raise OpBuildError(f"DeepSpeed was rebuilt but {still.stderr.strip()}")
    print(f"built {', '.join(wanted)} in {time.monotonic() - started:.0f} s")
    return 0


def main(argv=None) -> int:
    return run_tool(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
