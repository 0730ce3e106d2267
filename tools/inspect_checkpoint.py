"""Show what a checkpoint holds: iteration, layout, model config, parameter shapes and norms.

    python tools/inspect_checkpoint.py --checkpoint checkpoints
    python tools/inspect_checkpoint.py --checkpoint checkpoints/global_step200 --json

Norms are of the full (merged) tensors, so they are the same at any tp/pp layout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.checkpoint_tools import (  # noqa: E402
    CheckpointReader,
    config_from_files,
    format_summary,
    summarize,
)


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
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = config_from_files(args.config) if args.config else None
    summary = summarize(CheckpointReader(args.checkpoint, cfg), norms=not args.no_norms)
    print(json.dumps(summary, indent=1) if args.json else format_summary(summary))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, KeyError, FileNotFoundError) as err:
        print(f"inspect_checkpoint.py: {err}", file=sys.stderr)
        sys.exit(2)
