"""Concatenate several `.bin/.idx` datasets (same dtype) into one.

    python tools/merge_datasets.py --input data/a_text_document data/b_text_document \\
        --output-prefix data/ab_text_document
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.data.dataset_tools import merge_datasets  # noqa: E402
from megatron.errors import run_tool  # noqa: E402


def _merge(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="dataset prefixes (no .bin/.idx)")
    p.add_argument("--output-prefix", required=True, help="prefix of the merged dataset")
    args = p.parse_args(argv)
    merged = merge_datasets(args.input, args.output_prefix)
    print(f"{args.output_prefix}: {merged.num_docs:,} documents, {merged.num_tokens:,} tokens")
    return 0


def main(argv=None) -> int:
    return run_tool(_merge, argv, status=1, label="error")


if __name__ == "__main__":
    sys.exit(main())
