"""Pre-flight check of the tokenizer files, and the one tokenizer load `deepy.py` does.

`deepy.py` needs the tokenizer's vocabulary size to resolve `padded_vocab_size`, so it loads
the tokenizer before the checks run; `load_tokenizer` remembers that outcome (the tokenizer or
the error), so the check here and the datasets' dtype check reuse it instead of loading a
large `tokenizer.json` again. Errors name the key, the file and what the tokenizer type reads.
"""

from __future__ import annotations

from megatron.config import Config
from megatron.data.tokenizers import TOKENIZER_TYPES, Tokenizer, make_tokenizer
from megatron.preflight.findings import ERROR, OK, Finding, register

NAME = "tokenizer"

# What each tokenizer type reads, said in the error when a file is missing or does not load.
FILES_READ = {
    "GPT2BPETokenizer": "vocab_file (GPT-2 vocab.json) and merge_file (GPT-2 merges.txt)",
    "HFGPT2Tokenizer": "vocab_file (GPT-2 vocab.json) and merge_file (GPT-2 merges.txt)",
    "HFTokenizer": "vocab_file (a Hugging Face tokenizer.json)",
    "SPMTokenizer": "vocab_file (a SentencePiece .model)",
    "CharLevelTokenizer": "no files",
}

_LOADED: dict[tuple, Tokenizer | Exception] = {}


class TokenizerLoadError(ValueError):
    """The configured tokenizer cannot be built; the message names key, file and what is read."""


def _key(tokenizer_cfg) -> tuple:
    return (
        tokenizer_cfg.tokenizer_type,
        getattr(tokenizer_cfg, "vocab_file", None),
        getattr(tokenizer_cfg, "merge_file", None),
    )


def load_tokenizer(tokenizer_cfg) -> Tokenizer:
    """The tokenizer `tokenizer_cfg` (`cfg.tokenizer`) describes, built once per process.

    Raises TokenizerLoadError with the loader's message (which names the key and file) and
    the files this tokenizer type reads; a failed load is remembered too.
    """
    key = _key(tokenizer_cfg)
    if key not in _LOADED:
        try:
            _LOADED[key] = make_tokenizer(*key)
        except Exception as err:  # noqa: BLE001 - any loader failure is reported, named
            _LOADED[key] = err
    outcome = _LOADED[key]
    if isinstance(outcome, Exception):
        reads = FILES_READ.get(key[0])
        valid = f"; tokenizer_type {key[0]} reads {reads}" if reads else ""
        raise TokenizerLoadError(f"{outcome}{valid}") from outcome
    return outcome


def _files(tokenizer_cfg) -> str:
    tokenizer_type = tokenizer_cfg.tokenizer_type
    keys = TOKENIZER_TYPES[tokenizer_type][1] if tokenizer_type in TOKENIZER_TYPES else ()
    return ", ".join(f"{k} {getattr(tokenizer_cfg, k)}" for k in keys) or "no files"


@register(NAME, reads_worker_files=True)
def check_tokenizer(cfg: Config, script: str) -> list[Finding]:
    """The tokenizer files exist and load (every worker script tokenizes or detokenizes)."""
    try:
        tokenizer = load_tokenizer(cfg.tokenizer)
    except TokenizerLoadError as err:
        return [Finding(NAME, ERROR, f"cannot load the tokenizer: {err}")]
    message = (
        f"{cfg.tokenizer.tokenizer_type} ({_files(cfg.tokenizer)}) loads: "
        f"vocabulary {tokenizer.vocab_size:,}"
    )
    return [Finding(NAME, OK, message)]
