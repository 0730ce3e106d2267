"""A small preference set built without internet from the embedded corpus (embedded.py).

Each record takes a window of a text: the prompt is its first `prompt_words` words, `chosen` the
real continuation (the next `completion_words` words) and `rejected` the same words shuffled
(a seeded permutation that differs from the original order). A model trained with DPO on it
should come to prefer fluent text, which makes it a quick end-to-end check of a preference
objective; the same windows give a chat set for SFT (user: prompt, assistant: continuation).

    paths = build_preference_set(Path("data"), n_train=512, n_valid=64, seq_length=64)
    # paths["pairs_train"] -> "data/preference/train" (+ _text_pos_document, ...)

Windows come from the middle 80% of each text, away from the Project Gutenberg header and
licence, and never straddle two texts.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from megatron.data.embedded import install_gpt2_files, shakespeare_texts
from megatron.data.preprocess.post_training import PostTrainingOptions, preprocess_post_training


def _words(path: Path) -> list[str]:
    words = path.read_text(encoding="utf-8", errors="replace").split()
    cut = len(words) // 10
    return words[cut : len(words) - cut]


def _shuffled(words: list[str], rng: random.Random) -> list[str] | None:
    """A permutation of `words` that differs from them; None when every order is the same."""
    if len(set(words)) < 2:
        return None
    while True:
        out = words[:]
        rng.shuffle(out)
        if out != words:
            return out


def preference_records(texts: list[Path], n: int, seed: int = 1234, prompt_words: int = 12,
                       completion_words: int = 10) -> list[dict]:  # fmt: skip
    """`n` records {"prompt", "chosen", "rejected"} from random windows of `texts`."""
    rng = random.Random(seed)
    corpora = [w for w in (_words(p) for p in texts) if len(w) > prompt_words + completion_words]
    if not corpora:
        raise ValueError(f"no text among {[str(p) for p in texts]} is long enough for a window")
    records = []
    while len(records) < n:
        words = rng.choice(corpora)
        start = rng.randrange(len(words) - prompt_words - completion_words)
        prompt = words[start : start + prompt_words]
        completion = words[start + prompt_words : start + prompt_words + completion_words]
        rejected = _shuffled(completion, rng)
        if rejected is None:
            continue
        records.append({"prompt": " ".join(prompt), "chosen": " " + " ".join(completion),
                        "rejected": " " + " ".join(rejected)})  # fmt: skip
    return records


def chat_record(pair: dict) -> dict:
    """The SFT form of a preference record: the user gives the prompt, the assistant the real
    continuation."""
    return {"messages": [{"role": "user", "content": pair["prompt"]},
                         {"role": "assistant", "content": pair["chosen"].strip()}]}  # fmt: skip


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def build_preference_set(data_dir: Path, n_train: int = 512, n_valid: int = 64, seed: int = 1234,
                         seq_length: int | None = None, texts: list[Path] | None = None,
                         prompt_words: int = 12, completion_words: int = 10,
                         log=None) -> dict[str, str]:  # fmt: skip
    """Write {data_dir}/preference/{train,valid}.jsonl and chat_{train,valid}.jsonl, preprocess
    them with GPT-2's tokenizer, and return the output prefixes by name (`pairs_train`,
    `pairs_valid`, `chat_train`, `chat_valid`): append `_text_pos_document` etc. (post_formats).
    Records longer than `seq_length + 1` tokens (the chat form is longer: ChatML markers) are
    dropped and reported."""
    log = log if log is not None else sys.stderr
    vocab, merges = install_gpt2_files(data_dir)
    texts = texts if texts is not None else shakespeare_texts()
    records = preference_records(texts, n_train + n_valid, seed, prompt_words, completion_words)
    splits = {"train": records[:n_train], "valid": records[n_train:]}
    out = data_dir / "preference"
    prefixes = {}
    for split, pairs in splits.items():
        for kind, rows, fmt in (("pairs", pairs, "pairs"),
                                ("chat", [chat_record(p) for p in pairs], "chat")):  # fmt: skip
            name = split if kind == "pairs" else f"chat_{split}"
            _write_jsonl(out / f"{name}.jsonl", rows)
            options = PostTrainingOptions(
                inputs=[str(out / f"{name}.jsonl")], output_prefix=str(out / name),
                data_format=fmt, tokenizer_type="GPT2BPETokenizer", vocab_file=str(vocab),
                merge_file=str(merges), seq_length=seq_length,
            )  # fmt: skip
            preprocess_post_training(options, log=log)
            prefixes[f"{kind}_{split}"] = str(out / name)
    return prefixes
