"""Turn chat (SFT), preference-pair (DPO, reward model) and KTO jsonl into mmap datasets.

    python tools/preprocess_post_training.py --format pairs --input prefs.jsonl \\
        --output-prefix data/prefs --tokenizer-type HFTokenizer --vocab-file tokenizer.json \\
        --seq-length 2048

See `--help` and megatron/data/preprocess/post_cli.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.data.preprocess.post_cli import main  # noqa: E402
from megatron.errors import run_tool  # noqa: E402

if __name__ == "__main__":
    # `main` reports its own data errors (it is also a console script, which cannot reach
    # megatron/errors.py); any other user error ends the same way here.
    sys.exit(run_tool(main, status=1, label="error"))
