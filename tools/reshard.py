"""Reshard a checkpoint to another tensor/pipeline-parallel layout.

    python tools/reshard.py --checkpoint checkpoints --output checkpoints_tp1 \\
        --model-parallel-size 1 --pipe-parallel-size 1

Model weights always move, and the optimizer state (Adam moments, step counts, ...) from any
ZeRO stage 0-3 for the elementwise optimizers; for others the report names the optimizer and
says it was dropped (resume with `no_load_optim: true`). The output resumes at any
data-parallel size with the ZeRO stage given by `--zero-stage`: 0 (default; module and
optimizer in the mp_rank files), or 1-3 (DeepSpeed's universal layout, its `load_universal`
path, `megatron/checkpoint_tools/universal.py`; ZeRO 2 and 3 on the plain engine only, ZeRO 3
at tensor-parallel size 1 and with Adam only).
Iteration, consumed samples, skipped-step counters and the LR schedule carry over: resume with
`load: {output}`, the new model_parallel_size / pipe_parallel_size / number of ranks, and
that zero_optimization stage. `--expert-parallel-size` converts a Mixture-of-Experts
checkpoint to another moe_expert_parallel_size (ZeRO stage 0), weights and optimizer state.
A folder GPT-NeoX saved holds no config.json: give its run's config files with `--config`
(iteration, LR schedule and consumed samples then come from GPT-NeoX's entries).
(Why an offline tool, and DeepSpeed's universal checkpoint's limits for our checkpoints:
`megatron/checkpoint_tools/reshard.py`.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.kernels.deepspeed_ops import choose_accelerator  # noqa: E402

choose_accelerator()  # before the imports below import DeepSpeed: it need not guess

from megatron.checkpoint_tools import config_from_files, reshard_checkpoint  # noqa: E402
from megatron.errors import run_tool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="save folder (its latest) or global_stepN")
    p.add_argument("--output", required=True, help="save folder to write the resharded one into")
    p.add_argument("--model-parallel-size", type=int, required=True, help="target tensor parallel")
    p.add_argument(
        "--pipe-parallel-size",
        type=int,
        required=True,
        help="target pipeline stages (0: plain engine, for ZeRO 2/3)",
    )
    p.add_argument(
        "--zero-stage",
        type=int,
        default=0,
        choices=(0, 1, 2, 3),
        help="ZeRO stage of the run that resumes it (1-3: DeepSpeed's universal layout)",
    )
    p.add_argument(
        "--expert-parallel-size",
        type=int,
        default=None,
        help="moe_expert_parallel_size of the run that resumes it (default: the source's)",
    )
    p.add_argument(
        "--config",
        nargs="*",
        default=[],
        help="config files of the run that saved it (default: its config.json; GPT-NeoX's "
        "folders have none)",
    )
    p.add_argument("--no-optimizer", action="store_true", help="drop the optimizer state")
    p.add_argument("--overwrite", action="store_true", help="replace an existing global_stepN")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = reshard_checkpoint(
        args.checkpoint,
        args.output,
        tp=args.model_parallel_size,
        pp=args.pipe_parallel_size,
        optimizer=not args.no_optimizer,
        overwrite=args.overwrite,
        zero_stage=args.zero_stage,
        ep=args.expert_parallel_size,
        cfg=config_from_files(args.config) if args.config else None,
    )
    print(result.report())
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main))
