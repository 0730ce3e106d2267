"""Build the DeepSpeed ops this trainer loads, once, at install time (the README's install step).

    python tools/build_deepspeed_ops.py            # no-op when they are built already
    python tools/build_deepspeed_ops.py --check    # exit 1 and name them when any is missing

Without it, DeepSpeed compiles them in the first worker that needs one (on a CPU, its
shared-memory all-reduce: about 80 s before the first step), under a lock file that a killed
run leaves behind. This reinstalls the installed DeepSpeed version from its source with
`DS_BUILD_<OP>=1` for the ops of `megatron/kernels/deepspeed_ops.py`, against the torch of
this environment (`--no-build-isolation`; no other package changes), and checks the result.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.errors import run_tool  # noqa: E402
from megatron.kernels.deepspeed_ops import (  # noqa: E402
    BUILD_VARS,
    OPS_BY_ACCELERATOR,
    accelerator,
    missing_ops,
)


class OpBuildError(ValueError):
    """DeepSpeed could not be rebuilt with its ops (the pip output says why)."""


def rebuild(ops: list[str], kind: str) -> None:
    """Reinstall the installed DeepSpeed version from source with `ops` built."""
    from deepspeed import __version__

    env = {**os.environ, "DS_ACCELERATOR": kind, **{BUILD_VARS[op]: "1" for op in ops}}
    argv = [
        sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
        "--no-binary", "deepspeed", "--no-cache-dir", "--force-reinstall",
        f"deepspeed=={__version__}",
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise OpBuildError(
            f"pip could not rebuild DeepSpeed {__version__} with {', '.join(ops)} "
            f"(exit status {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
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
    print(f"building DeepSpeed's {', '.join(missing)} for {kind} (a few minutes) ...", flush=True)
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
