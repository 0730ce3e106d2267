"""Time from `deepy.py` to the first logged iteration of a fresh run: what a newcomer waits.

    python bench/bench_first_step.py [--python PYTHON] [--label NAME] [--out FILE]
                                     [--set KEY=VALUE ...]
                                     [-- CONFIG ... (default configs/small.yml local.yml)]

Runs `PYTHON deepy.py train.py CONFIG... --set train_iters=1 --set log_interval=1` of a
2-layer model (`FIRST_STEP_SETS`, then `--set`) with an empty `TORCH_EXTENSIONS_DIR` (so
nothing torch's JIT builder cached before counts) and fresh checkpoint and log folders, and
reports the seconds until the console shows `iteration 1` (logged as the step ends, before the
final checkpoint is saved), the phases on the way by the console's own lines (`deepy` done:
`deepy: launching`; runner, launcher, worker imports, engine and data built: `start-up
report`; the first step: `iteration 1`), and whether DeepSpeed compiled anything (a build
folder appeared). Give `--python` of an environment installed without
`tools/build_deepspeed_ops.py` for the "before" figure; each call appends its record to
`--out` (default `bench/results/first_step.json`).
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


# A 2-layer model, its first iteration logged as soon as it ends.
FIRST_STEP_SETS = ["num_layers=2", 'attention_config=[[["global"], 2]]', "log_interval=1"]
# The console line that closes each phase (seconds since the launch, printed as they arrive).
PHASES = {
    "deepy (config, tokenizer, pre-flight)": "deepy: launching",
    "runner, launcher, worker start, engine, data": "start-up report",
    "first step": "iteration 1/",
}


def first_step_seconds(
    python: str, configs: list[str], work: Path, extra: list[str] = ()
) -> tuple[dict[str, float], list[str]]:
    """Seconds to the end of each phase (the last: the first `iteration 1` line), and the
    extensions torch built meanwhile."""
    extensions = work / "extensions"
    sets = [f"save={work / 'ckpt'}", f"load={work / 'ckpt'}", f"log_dir={work / 'logs'}"]
    argv = [python, "deepy.py", "train.py", *configs, "--set", "train_iters=1"]
    for item in [*FIRST_STEP_SETS, *extra, *sets]:
        argv += ["--set", item]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    run = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seconds: dict[str, float] = {}
    for line in run.stdout:
        for phase, marker in PHASES.items():
            if phase not in seconds and marker in line:
                seconds[phase] = time.monotonic() - started
    if run.wait() != 0 or len(seconds) < len(PHASES):
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
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("configs", nargs="*", default=["configs/small.yml", "local.yml"])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        ends, built = first_step_seconds(args.python, args.configs, Path(work), args.sets)
    seconds = ends["first step"]
    previous, phases = 0.0, {}
    for phase, end in ends.items():
        phases[phase] = round(end - previous, 2)
        previous = end
    record = {
        "label": args.label,
        "python": args.python,
        "configs": args.configs,
        "sets": [*FIRST_STEP_SETS, *args.sets],
        "seconds_to_first_iteration": round(seconds, 1),
        "phases_s": phases,
        "compiled_at_run_time": built,
        "cpu": _cpu_name(),
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(f"{args.label}: first iteration after {seconds:.1f} s; compiled: {built or 'nothing'}")
    for phase, spent in phases.items():
        print(f"  {phase}: {spent:.2f} s")
    records = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(records + [record], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
