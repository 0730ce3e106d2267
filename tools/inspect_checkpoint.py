"""Show what a checkpoint holds: iteration, layout, ZeRO stage, optimizer, model config,
parameter shapes and norms; and whether a run can resume it at another layout.

    python tools/inspect_checkpoint.py --checkpoint checkpoints
    python tools/inspect_checkpoint.py --checkpoint checkpoints/global_step200 --json
    python tools/inspect_checkpoint.py --checkpoint checkpoints --resume-at tp=2,pp=1,dp=4,zero=1

Norms are of the full (merged) tensors, so they are the same at any tp/pp layout (and
expert-parallel size: `ep=` in the layout line; `ep=E` in `--resume-at`, default the saved one).
`--resume-at` (or `--resume-config`, a run's config files) answers with `train.py`'s own
rule, the pre-flight's (`megatron/preflight/checkpoints.py`): resumes directly, needs
`tools/reshard.py` first (the command is printed), or cannot with its optimizer state (and
why: no such tp/pp split, an optimizer state that cannot move, or a ZeRO stage that cannot
restore a converted one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.kernels.deepspeed_ops import choose_accelerator  # noqa: E402

choose_accelerator()  # before the imports below import DeepSpeed: it need not guess

from megatron.checkpoint_tools import (  # noqa: E402
    CheckpointReader,
    config_from_files,
    format_summary,
    summarize,
)
from megatron.checkpoint_tools.optimizer_read import unmovable_reason  # noqa: E402
from megatron.checkpoint_tools.reader import load_saved_config  # noqa: E402
from megatron.checkpoint_tools.reshard import check_layout  # noqa: E402
from megatron.checkpoint_tools.universal import reshard_stage  # noqa: E402
from megatron.errors import run_tool  # noqa: E402
from megatron.preflight.checkpoints import _layout_finding  # noqa: E402

RESUME_KEYS = ("tp", "pp", "dp", "zero")
OPTIONAL_KEYS = ("ep",)  # moe_expert_parallel_size; default: the checkpoint's


def parse_resume_at(text: str) -> dict[str, int]:
    """`tp=2,pp=1,dp=4,zero=1` as a dict; every one of RESUME_KEYS is needed."""
    target = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key not in RESUME_KEYS + OPTIONAL_KEYS or not value.strip().isdigit():
            raise ValueError(
                f"--resume-at: '{part}' is not valid; expected {','.join(RESUME_KEYS)} (and "
                "optionally ep) each as key=integer, e.g. tp=2,pp=1,dp=4,zero=1,ep=2"
            )
        target[key] = int(value)
    missing = [k for k in RESUME_KEYS if k not in target]
    if missing:
        raise ValueError(f"--resume-at '{text}': give {', '.join(missing)} too (key=integer)")
    if target["zero"] > 3 or min(target["tp"], target["dp"]) < 1:
        raise ValueError(f"--resume-at '{text}': tp, dp >= 1 and zero in 0..3")
    return target


def target_from_config(cfg) -> dict[str, int]:
    """The layout a resolved run config asks for."""
    p = cfg.parallel
    return {
        "tp": p.model_parallel_size,
        "pp": p.pipe_parallel_size,
        "dp": p.data_parallel_size,
        "zero": p.zero_stage,
        "ep": cfg.moe.moe_expert_parallel_size,
    }


def _resuming_config(saved, target: dict[str, int]):
    """The checkpoint's own config, moved to the target layout (what the rule reads)."""
    parallel = dataclasses.replace(
        saved.parallel,
        model_parallel_size=target["tp"],
        pipe_parallel_size=target["pp"],
        data_parallel_size=target["dp"],
        zero_stage=target["zero"],
    )
    ep = target.get("ep", saved.moe.moe_expert_parallel_size)
    moe = dataclasses.replace(saved.moe, moe_expert_parallel_size=ep)
    return dataclasses.replace(saved, parallel=parallel, moe=moe)


def resume_verdict(reader, target: dict[str, int]) -> dict:
    """`{"verdict": direct | reshard | cannot, "reason": ...}` for a train.py resume at
    `target`, by the pre-flight's rule (one definition: what the pre-flight refuses, this
    says needs converting)."""
    layout, saved = reader.layout, load_saved_config(reader.layout)
    try:
        check_layout(reader.schema, target["tp"], target["pp"])
    except ValueError as err:
        return {"verdict": "cannot", "reason": str(err)}
    finding = _layout_finding(layout, _resuming_config(saved, target))
    if finding is None:
        old = (layout.tp, layout.pp, saved.parallel.data_parallel_size)
        same = old == (target["tp"], target["pp"], target["dp"])
        note = "" if same else "; dropout RNG streams restart from the seed (not bitwise)"
        return {"verdict": "direct", "reason": f"train.py loads it as it is{note}"}
    stage, why = reshard_stage(target["zero"], target["tp"], target["pp"])
    stuck = why.strip(" ()") or unmovable_reason(saved, stage)
    if stuck:  # only the weights can move there (tools/reshard.py --no-optimizer)
        return {"verdict": "cannot", "reason": f"with its optimizer state: {stuck}"}
    return {"verdict": "reshard", "reason": finding.message}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="save folder (its latest) or global_stepN")
    p.add_argument("--config", nargs="*", default=[], help="config files (default: the saved one)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--no-norms",
        action="store_true",
        help="shapes from the config only; reads no weights (fast)",
    )
    p.add_argument("--resume-at", help="tp=T,pp=P,dp=D,zero=Z[,ep=E]: can a run resume it there?")
    p.add_argument("--resume-config", nargs="*", help="or: the resuming run's config files")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = config_from_files(args.config) if args.config else None
    reader = CheckpointReader(args.checkpoint, cfg)
    summary = summarize(reader, norms=not args.no_norms)
    if args.resume_at or args.resume_config:
        if args.resume_config:
            target = target_from_config(config_from_files(args.resume_config))
        else:
            target = parse_resume_at(args.resume_at)
        summary["resume"] = resume_verdict(reader, target)
    print(json.dumps(summary, indent=1) if args.json else format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main))
