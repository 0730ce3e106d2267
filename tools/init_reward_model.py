"""Start a reward model (train_impl: rm) from a language model's checkpoint.

    python tools/init_reward_model.py --checkpoint checkpoints/sft \\
        --config configs/my-rm.yml local.yml --output checkpoints/rm-init [--set KEY=VALUE]

writes `{output}/global_step0` at the config's tensor/pipeline layout: the language model's
body, no vocabulary head, and a value head drawn from the config's seed (as a fresh run would
draw it). Train with `load: {output}` and `finetune: true`. The config must set
`train_impl: rm` and describe the language model's architecture; any mismatch is refused
naming the tensor (exit status 2). See megatron/checkpoint_tools/reward_init.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.kernels.deepspeed_ops import choose_accelerator  # noqa: E402

choose_accelerator()  # before the imports below import DeepSpeed: it need not guess

from megatron.checkpoint_tools import config_from_files  # noqa: E402
from megatron.checkpoint_tools.reward_init import init_reward_model  # noqa: E402
from megatron.errors import run_tool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--checkpoint", required=True, help="the language model: save folder or global_stepN"
    )
    p.add_argument("--config", nargs="+", required=True, help="the reward model's config files")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, as deepy.py's --set",
    )
    p.add_argument("--output", required=True, help="save folder to write global_step0 into")
    p.add_argument("--overwrite", action="store_true", help="replace an existing global_step0")
    return p.parse_args(argv)


def _init(argv) -> int:
    args = parse_args(argv)
    cfg = config_from_files(args.config, args.set)
    result = init_reward_model(args.checkpoint, cfg, args.output, overwrite=args.overwrite)
    print(result.report())
    return 0


def main(argv=None) -> int:
    return run_tool(_init, argv)


if __name__ == "__main__":
    sys.exit(main())
