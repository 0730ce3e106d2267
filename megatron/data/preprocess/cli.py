"""Command line of preprocessing (`tools/preprocess_data.py`, console script
`megatron-preprocess`).

Tokenize jsonl / jsonl.gz / jsonl.zst / plain text into Megatron mmap datasets::

    python tools/preprocess_data.py --input corpus.jsonl.zst more/ \\
        --output-prefix data/mydata --tokenizer-type HFTokenizer --vocab-file tokenizer.json \\
        --append-eod --workers 8

writes data/mydata_text_document.bin/.idx (one pair per --jsonl-keys key). A jsonl line is a
document; a plain text file is a document. Bad lines (malformed JSON, missing key, non-UTF-8,
empty) are skipped and reported at the end with their first locations; --strict stops instead.
"""

from __future__ import annotations

import argparse
import sys

from megatron.data.preprocess.encoder import PreprocessError
from megatron.data.preprocess.pipeline import PreprocessOptions, preprocess
from megatron.data.tokenizers import TOKENIZER_TYPES, TokenizerError


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--input", nargs="+", required=True, help="files or folders (comma-separated lists allowed)"
    )
    p.add_argument(
        "--jsonl-keys",
        nargs="+",
        default=["text"],
        help="json keys to extract; one dataset per key (default: text)",
    )
    p.add_argument("--output-prefix", required=True, help="writes {prefix}_{key}_document.bin/.idx")
    p.add_argument("--tokenizer-type", required=True, choices=list(TOKENIZER_TYPES))
    p.add_argument("--vocab-file", help="vocab.json, tokenizer.json or a sentencepiece .model")
    p.add_argument("--merge-file", help="merges.txt (GPT-2 BPE)")
    p.add_argument(
        "--append-eod",
        action="store_true",
        help="end each document with the EOD token (skipped if the tokenizer adds it)",
    )
    add_run_options(p, "documents")
    return p.parse_args(argv)  # fmt: skip


def add_run_options(p: argparse.ArgumentParser, unit: str) -> None:
    """The options every preprocessing tool shares: workers, progress, strictness and
    GPT-NeoX's `--dataset-impl` (`unit`: what the progress lines count)."""
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes (default 1)")
    p.add_argument(
        "--log-interval", type=int, default=10_000, help=f"{unit} between progress lines"
    )
    p.add_argument("--strict", action="store_true", help="stop at the first bad record")
    p.add_argument(
        "--dataset-impl",
        default="mmap",
        choices=["mmap"],
        help="accepted for GPT-NeoX compatibility; only mmap is written",
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    options = PreprocessOptions(
        inputs=args.input,
        output_prefix=args.output_prefix,
        tokenizer_type=args.tokenizer_type,
        vocab_file=args.vocab_file,
        merge_file=args.merge_file,
        jsonl_keys=tuple(args.jsonl_keys),
        append_eod=args.append_eod,
        workers=args.workers,
        log_interval=args.log_interval,
        strict=args.strict,
    )
    try:
        preprocess(options)
    except (PreprocessError, TokenizerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
