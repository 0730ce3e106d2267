"""Time from `deepy.py` to the first logged iteration of a fresh run: what a newcomer waits.

    python bench/bench_first_step.py [--python PYTHON] [--label NAME] [--out FILE]
                                     [-- CONFIG ... (default configs/small.yml local.yml)]

Runs `PYTHON deepy.py train.py CONFIG... --set train_iters=1` with an empty
`TORCH_EXTENSIONS_DIR` (so nothing torch's JIT builder cached before counts) and fresh
checkpoint and log folders, and reports the seconds until the console shows `iteration 1`,
and whether DeepSpeed compiled anything on the way (a build folder appeared). Give `--python`
of an environment installed without `tools/build_deepspeed_ops.py` for the "before" figure;
each call appends its record to `--out` (default `bench/results/first_step.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "first_step.json"


def first_step_seconds(python: str, configs: list[str], work: Path) -> tuple[float, list[str]]:
    """Seconds to the first `iteration 1` line, and the extensions torch built meanwhile."""
    extensions = work / "extensions"
    sets = [f"save={work / 'ckpt'}", f"load={work / 'ckpt'}", f"log_dir={work / 'logs'}"]
    argv = [python, "deepy.py", "train.py", *configs, "--set", "train_iters=1"]
    for item in sets:
        argv += ["--set", item]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    run = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seconds = None
    for line in run.stdout:
        if seconds is None and "iteration 1/" in line:
            seconds = time.monotonic() - started
    if run.wait() != 0 or seconds is None:
        raise SystemExit(f"the run failed (exit status {run.returncode})")
    built = sorted({p.parent.name for p in extensions.rglob("build.ninja")})
    return seconds, built


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--label", default="this environment")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("configs", nargs="*", default=["configs/small.yml", "local.yml"])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        seconds, built = first_step_seconds(args.python, args.configs, Path(work))
    record = {
        "label": args.label,
        "python": args.python,
        "configs": args.configs,
        "seconds_to_first_iteration": round(seconds, 1),
        "compiled_at_run_time": built,
        "cpu": _cpu_name(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(f"{args.label}: first iteration after {seconds:.1f} s; compiled: {built or 'nothing'}")
    records = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(records + [record], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
