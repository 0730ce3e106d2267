"""Tokenizer files of a Hugging Face model directory, from our tokenizer settings and back.

Export (`export_tokenizer`): the files the config names are copied under Hugging Face's names
with a `tokenizer_config.json` that `AutoTokenizer` reads, never adding a BOS token (our
models are trained without one):

| tokenizer_type                    | files written           | tokenizer_class         |
| --------------------------------- | ----------------------- | ----------------------- |
| HFTokenizer                       | tokenizer.json          | PreTrainedTokenizerFast |
| GPT2BPETokenizer, HFGPT2Tokenizer | vocab.json, merges.txt  | GPT2Tokenizer           |
| SPMTokenizer                      | tokenizer.model         | LlamaTokenizer          |
| CharLevelTokenizer                | none (no HF equivalent) |                         |

Import (`import_tokenizer`): a directory's `tokenizer.json` is copied and used as
`HFTokenizer`, else `vocab.json` + `merges.txt` as `HFGPT2Tokenizer`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# tokenizer_type -> ((config key, file name in the HF directory), ...), tokenizer_class
_EXPORTS: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {
    "HFTokenizer": ((("vocab_file", "tokenizer.json"),), "PreTrainedTokenizerFast"),
    "GPT2BPETokenizer": (
        (("vocab_file", "vocab.json"), ("merge_file", "merges.txt")),
        "GPT2Tokenizer",
    ),
    "HFGPT2Tokenizer": (
        (("vocab_file", "vocab.json"), ("merge_file", "merges.txt")),
        "GPT2Tokenizer",
    ),
    "SPMTokenizer": ((("vocab_file", "tokenizer.model"),), "LlamaTokenizer"),
}


def export_tokenizer(tokenizer_cfg, output: Path, *, max_length: int) -> tuple[list[str], str]:
    """Copy the tokenizer files into `output`; `(files written, "")` or `([], why not)`."""
    kind = tokenizer_cfg.tokenizer_type
    if kind not in _EXPORTS:
        return [], f"tokenizer_type {kind} has no Hugging Face tokenizer"
    files, tokenizer_class = _EXPORTS[kind]
    sources = [(getattr(tokenizer_cfg, key, None), name) for key, name in files]
    missing = [str(src) for src, _ in sources if not src or not Path(src).is_file()]
    if missing:
        return [], f"tokenizer file(s) {', '.join(missing)} not found here"
    from types import SimpleNamespace

    from megatron.data.tokenizers import build_tokenizer

    tokenizer = build_tokenizer(SimpleNamespace(tokenizer=tokenizer_cfg))
    written = []
    for src, name in sources:
        shutil.copyfile(src, output / name)
        written.append(name)
    eod_text = _token_text(tokenizer, tokenizer.eod)
    config = {
        "tokenizer_class": tokenizer_class,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": max_length,
    }
    if eod_text is not None:
        config.update(eos_token=eod_text, bos_token=eod_text, unk_token=eod_text)
    (output / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return written + ["tokenizer_config.json"], ""


def _token_text(tokenizer, token_id: int) -> str | None:
    backend = getattr(tokenizer, "_backend", None)
    if backend is not None and hasattr(backend, "id_to_token"):
        return backend.id_to_token(token_id)
    return None


def import_tokenizer(hf_dir: Path, output: Path) -> dict[str, str]:
    """Copy a Hugging Face directory's tokenizer into `output`; our tokenizer config keys
    (empty when the directory has none we can read)."""
    if (hf_dir / "tokenizer.json").is_file():
        shutil.copyfile(hf_dir / "tokenizer.json", output / "tokenizer.json")
        return {"tokenizer_type": "HFTokenizer", "vocab_file": str(output / "tokenizer.json")}
    if (hf_dir / "vocab.json").is_file() and (hf_dir / "merges.txt").is_file():
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(hf_dir / name, output / name)
        return {
            "tokenizer_type": "HFGPT2Tokenizer",
            "vocab_file": str(output / "vocab.json"),
            "merge_file": str(output / "merges.txt"),
        }
    return {}
