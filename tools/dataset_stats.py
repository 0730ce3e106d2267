"""Documents, tokens and a document-length histogram of `.bin/.idx` datasets.

python tools/dataset_stats.py data/shakespeare/shakespeare_text_document [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.data.dataset_tools import dataset_stats  # noqa: E402
from megatron.errors import run_tool  # noqa: E402


def _stats(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("prefix", nargs="+", help="dataset prefixes (no .bin/.idx)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    stats = [dataset_stats(prefix) for prefix in args.prefix]
    if args.json:
        print(json.dumps([s.as_dict() for s in stats], indent=2))
    else:
        print("\n\n".join(s.table() for s in stats))
    return 0


def main(argv=None) -> int:
    return run_tool(_stats, argv, status=1, label="error")


if __name__ == "__main__":
    sys.exit(main())
