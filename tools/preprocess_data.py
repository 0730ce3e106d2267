"""Tokenize jsonl / jsonl.gz / jsonl.zst / plain text into Megatron mmap datasets.

    python tools/preprocess_data.py --input corpus.jsonl.zst more/ \\
        --output-prefix data/mydata --tokenizer-type HFTokenizer --vocab-file tokenizer.json \\
        --append-eod --workers 8

See `--help` and megatron/data/preprocess/cli.py (also installed as `megatron-preprocess`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.data.preprocess.cli import main  # noqa: E402
from megatron.errors import run_tool  # noqa: E402

if __name__ == "__main__":
    # `main` reports its own data errors (it is also a console script, which cannot reach
    # megatron/errors.py); any other user error ends the same way here.
    sys.exit(run_tool(main, status=1, label="error"))
