"""Peak memory of a training step: our trainer against the plain PyTorch loop, one fresh
process per contender.

    python bench/bench_train_memory.py [configs...] [--set KEY=VALUE ...] [--steps 3]
                                       [--precisions fp32,bf16] [--loss-chunk-tokens N[,N...]]
                                       [--vocab-size V] [--out PATH]

The contenders are `bench_train.py`'s (our pipeline and plain engines with the config's
`loss_chunk_tokens`, named `...:config` (null: the fused head, auto-sized), and with each
`--loss-chunk-tokens N` again, `...:N` (0: the full logits); the eager
`transformers.GPTNeoXForCausalLM` loop), built from the same config and fed the same batches. Each
runs in a process of its own (`--child`), so one's memory cannot hide in another's high-water mark:
it builds its step function, reads its resident set (`after_build`), runs `--steps` steps and reads
the process's peak resident set (`ru_maxrss`, the kernel's high-water mark; on a CPU every tensor is
host memory). `step_peak` = peak - after_build is what the steps added on top of the built model
(activations, logits, gradients, optimizer states made by the first step), measured the same way for
every contender; the ratio to the loop's is printed and written as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import bench_train  # noqa: E402


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(args) -> dict:
    """Build one contender, step it, report its memory (the module docstring)."""
    precision, engine, chunk = args.child.split(":")
    sets = dict(precision=bench_train.PRECISIONS[precision])
    cfg = bench_train.resolve(args.configs, args.overrides, **sets)
    batches = bench_train.fixed_batches(cfg, args.steps)
    if engine == "loop":
        step = bench_train.plain_loop(cfg, bf16=precision == "bf16")
    else:
        changes = dict(pipe_parallel_size={"pipeline": 1, "plain": 0}[engine], **sets)
        if chunk != "config":  # else the config's own value (null: the fused head, auto-sized)
            changes["loss_chunk_tokens"] = int(chunk)
        step = bench_train.ours(
            bench_train.resolve(args.configs, args.overrides, **changes), batches
        )
    built = rss_bytes()
    for batch in batches:
        step(batch)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"after_build": built, "peak": peak, "step_peak": peak - built}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("configs", nargs="*", default=["configs/small.yml", "configs/local.yml"])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16")
    bench_train.add_loss_chunks_argument(parser)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "train_memory_cpu.json"))
    bench_train.add_vocab_size_argument(parser)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    bench_train.VOCAB_SIZE = args.vocab_size
    os.environ.setdefault("MASTER_PORT", "29519")
    if args.child:
        print(json.dumps(child(args)))
        return 0
    runs = []
    for precision in args.precisions.split(","):
        names = [f"{precision}:{e}:config" for e in ("pipeline", "plain")]
        for chunk in bench_train.loss_chunks(args):
            names += [f"{precision}:{e}:{chunk}" for e in ("pipeline", "plain")]
        names.append(f"{precision}:loop:config")
        for name in names:
            sets = [arg for s in args.overrides for arg in ("--set", s)]
            if args.vocab_size:
                sets += ["--vocab-size", str(args.vocab_size)]
            cmd = [sys.executable, __file__, *args.configs, *sets, "--steps", str(args.steps),
                   "--child", name]  # fmt: skip
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode:
                sys.exit(f"{name} failed:\n{run.stderr[-4000:]}")
            runs.append({"contender": name, **json.loads(run.stdout.strip().splitlines()[-1])})
    for run in runs:
        precision = run["contender"].split(":")[0]
        loop = next(r for r in runs if r["contender"] == f"{precision}:loop:config")
        run["step_peak_vs_loop"] = run["step_peak"] / loop["step_peak"]
        run["peak_vs_loop"] = run["peak"] / loop["peak"]
        print(
            f"{run['contender']:24s} after build {run['after_build'] / 2**20:8.0f} MiB  peak "
            f"{run['peak'] / 2**20:8.0f} MiB  step peak {run['step_peak'] / 2**20:8.0f} MiB  "
            f"vs loop {run['step_peak_vs_loop']:.2f} (whole process {run['peak_vs_loop']:.2f})"
        )
    result = {
        "command": " ".join(["python", "bench/bench_train_memory.py", *(argv or sys.argv[1:])]),
        "device": bench_train.cpu_name(),
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
