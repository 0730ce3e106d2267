"""Plan a run before launching it: per GPU memory of each pipeline stage's heaviest rank and a
step-time estimate, from the model the config builds (`megatron/planning/`).

    python tools/plan.py configs/160M.yml configs/local.yml --gpu A100-40GB
    python tools/plan.py tests/data/configs/neox/20B.yml --world-size 96 --vocab-size 50277 \\
        --gpu A100-40GB
    python tools/plan.py configs/llama-7B.yml --world-size 8 --vocab-size 32000 --gpu H100 \\
        --sweep train_micro_batch_size_per_gpu=1,2,4,8 --sweep zero_optimization.stage=0,1
    python tools/plan.py --gpus

The world size is the launcher settings' (the config's hostfile, `num_gpus`, `num_nodes`) as
`deepy.py` computes it, unless `--world-size` gives it; the vocabulary the tokenizer's, unless
`--vocab-size` gives it (a tokenizer whose files are not here). `--gpu` is `plan_gpu` (memory,
peak, NVLink); `--set` overrides any key as in `deepy.py`. Each `--sweep KEY=A,B,...` plans
every combination and prints one line each; `--json` prints the plans (a list with sweeps).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.errors import run_tool  # noqa: E402
from megatron.kernels.deepspeed_ops import choose_accelerator  # noqa: E402

choose_accelerator()  # before the planning imports import DeepSpeed: it need not guess


def parse_args(argv):
    p = argparse.ArgumentParser(prog="plan.py", description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="*", help="config files, merged in order (as deepy.py)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--world-size", type=int, help="ranks of the run (default: the launcher's)")
    p.add_argument("--vocab-size", type=int, help="the tokenizer's vocabulary (default: load it)")
    p.add_argument("--gpu", help="the GPU to plan for (plan_gpu); --gpus lists them")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=A,B,...",
                   help="plan each value (repeatable: every combination)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--gpus", action="store_true", help="list the GPUs a plan can be for")
    args = p.parse_args(argv)
    if not args.gpus and not args.configs:
        p.error("give config files (or --gpus)")
    return args


def gpu_table() -> str:
    from megatron.planning.gpus import GPUS

    lines = [f"{'GPU':<12} {'memory':>10} {'NVLink GB/s':>12} {'bf16 TFLOP/s':>13}"]
    for g in GPUS:
        nvlink = f"{g.nvlink_gb_per_s:g}" if g.nvlink_gb_per_s else "- (PCIe)"
        peak = g.peak_tflops("bf16")
        lines.append(f"{g.name:<12} {g.memory_gib:>6.1f} GiB {nvlink:>12} "
                     f"{peak if peak else '-':>13}")  # fmt: skip
    return "\n".join(lines)


def world_and_vocab(args) -> tuple[int, int]:
    """The world size and vocabulary `deepy.py` would resolve with (unless given)."""
    from megatron.config import ConfigError
    from megatron.config.resolve import load_settings, settings_group
    from megatron.launcher import planned_world_size

    settings = load_settings(args.configs, args.overrides)
    world = args.world_size or planned_world_size(settings_group(settings, "launcher"))
    if args.vocab_size:
        return world, args.vocab_size
    from megatron.preflight.tokenizer import TokenizerLoadError, load_tokenizer

    try:
        return world, load_tokenizer(settings_group(settings, "tokenizer")).vocab_size
    except TokenizerLoadError as err:
        raise ConfigError(f"{err}; give the vocabulary with --vocab-size N") from err


def sweep_points(sweeps: list[str]) -> list[list[str]]:
    """Each combination of the `--sweep` values, as `--set` overrides."""
    axes = []
    for sweep in sweeps:
        key, sep, values = sweep.partition("=")
        if not sep or not values:
            raise ValueError(f"--sweep '{sweep}': expected KEY=A,B,...")
        axes.append([f"{key}={v}" for v in values.split(",")])
    return [list(point) for point in itertools.product(*axes)]


def sweep_line(point: list[str], plan, changes) -> str:
    from megatron.planning.report import gib

    h, step = plan.heaviest, plan.step
    fits = {True: "fits", False: "does NOT fit", None: "-"}[plan.fits]
    time = f", ~{step.seconds:.3f} s/step, {step.tokens_per_s:,.0f} tokens/s" if step else ""
    hint = f" (fits with {changes[0]})" if plan.fits is False and changes else ""
    return f"{' '.join(point)}: stage {h.index} {gib(h.total)} {fits}{time}{hint}"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.gpus:
        with contextlib.redirect_stdout(sys.stderr):
            table = gpu_table()
        print(table)
        return 0
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's logger takes the stdout it finds
        from megatron.planning.files import plan_files
        from megatron.planning.report import render, to_json
    base = args.overrides + ([f"plan_gpu={args.gpu}"] if args.gpu else [])
    points = sweep_points(args.sweep) if args.sweep else [[]]
    results = []
    for point in points:
        with contextlib.redirect_stdout(sys.stderr):
            world, vocab = world_and_vocab(args)
            plan, changes = plan_files(args.configs, base + point, world_size=world,
                                       vocab_size=vocab)  # fmt: skip
        results.append((point, plan, changes))
        if not args.json:
            print(sweep_line(point, plan, changes) if args.sweep else render(plan, changes))
    if args.json:
        plans = [dict(to_json(plan, changes), sweep=point) for point, plan, changes in results]
        print(json.dumps(plans if args.sweep else plans[0], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main))
