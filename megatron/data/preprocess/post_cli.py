"""Command line of post-training preprocessing (`tools/preprocess_post_training.py`).

Turn chat, preference-pair and KTO jsonl into the datasets GPT-NeoX's post-training keys read::

    python tools/preprocess_post_training.py --format pairs --input prefs.jsonl \\
        --output-prefix data/prefs --tokenizer-type HFTokenizer --vocab-file tokenizer.json \\
        --seq-length 2048

Formats (one jsonl record per line; see megatron/data/preprocess/post_formats.py):
  chat   {"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}]}
         -> {prefix}_text_document, {prefix}_text_label_document (loss on assistant turns)
  pairs  {"prompt": str, "chosen": str, "rejected": str}, or chosen/rejected as message lists
         -> {prefix}_text_pos_document, _text_neg_document, _text_pos_label_document,
            _text_neg_label_document (document i of each is pair i; the prompt carries no loss)
  kto    {"prompt": ..., "completion": ..., "label": true|false}
         -> {prefix}_text_document, _text_label_document, _text_reward_document (+1 / -1 per token)

Chat turns are rendered with the tokenizer's chat template (the `chat_template` of the
tokenizer_config.json next to an HFTokenizer's tokenizer.json), else --chat-template (a
tokenizer_config.json, a .jinja file, or `chatml`, the default). Bad records (missing or
mistyped fields, pairs that do not align, samples longer than --seq-length + 1 tokens, no token
carrying loss) are skipped in every output and reported at the end; --strict stops instead.
At the end the tool prints the config keys to point at the outputs.
"""

from __future__ import annotations

import argparse
import sys

from megatron.data.preprocess.cli import add_run_options
from megatron.data.preprocess.encoder import PreprocessError
from megatron.data.preprocess.post_formats import POST_TRAINING_FORMATS
from megatron.data.preprocess.post_training import (
    LABEL_SCOPES,
    PostTrainingOptions,
    preprocess_post_training,
)
from megatron.data.tokenizers import TOKENIZER_TYPES, TokenizerError


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--format",
        required=True,
        choices=list(POST_TRAINING_FORMATS),
        help="record format (see above)",
    )
    p.add_argument(
        "--input", nargs="+", required=True, help="jsonl / jsonl.gz / jsonl.zst files or folders"
    )
    p.add_argument("--output-prefix", required=True, help="{prefix}_{output}_document.bin/.idx")
    p.add_argument("--tokenizer-type", required=True, choices=list(TOKENIZER_TYPES))
    p.add_argument("--vocab-file", help="vocab.json, tokenizer.json or a sentencepiece .model")
    p.add_argument("--merge-file", help="merges.txt (GPT-2 BPE)")
    p.add_argument(
        "--chat-template",
        help="`chatml`, a tokenizer_config.json or a .jinja file (default: the "
        "tokenizer's own template if it has one, else chatml)",
    )
    p.add_argument(
        "--seq-length", type=int, help="drop (and report) samples longer than seq_length + 1 tokens"
    )
    p.add_argument(
        "--label-scope",
        default="completion",
        choices=LABEL_SCOPES,
        help="completion: loss on the completion / assistant turns (default); "
        "eod: only on the final EOD token (GPT-NeoX's --for-rm)",
    )
    add_run_options(p, "records")
    return p.parse_args(argv)  # fmt: skip


def config_hint(data_format: str, outputs: dict[str, str]) -> str:
    """YAML lines pointing the format's training keys at `outputs` (train_*; valid_*/test_* take
    datasets built the same way from held-out records)."""
    keys = POST_TRAINING_FORMATS[data_format].config_keys
    return "\n".join(f'{keys[name]}: ["{prefix}"]' for name, prefix in outputs.items())


def main(argv=None) -> int:
    args = parse_args(argv)
    options = PostTrainingOptions(
        inputs=args.input,
        output_prefix=args.output_prefix,
        data_format=args.format,
        tokenizer_type=args.tokenizer_type,
        vocab_file=args.vocab_file,
        merge_file=args.merge_file,
        chat_template=args.chat_template,
        seq_length=args.seq_length,
        label_scope=args.label_scope,
        workers=args.workers,
        log_interval=args.log_interval,
        strict=args.strict,
    )
    try:
        summary = preprocess_post_training(options)
    except (PreprocessError, TokenizerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"config keys:\n{config_hint(args.format, summary.outputs)}", file=sys.stderr)
    return 0
