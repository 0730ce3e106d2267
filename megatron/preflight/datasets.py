"""Pre-flight check of the datasets `train.py` will read: every prefix the config names is one
whole `.bin/.idx` pair, and its dtype can hold every id of the tokenizer's vocabulary.

The pair is judged by the reader's own validation (`validate_pair`: header, dtype code, the
ends of doc_idx, the `.bin` length the index describes), which reads the index's first and
last entries and the file sizes, never the tokens: milliseconds even for a terabyte corpus.
For the same reason the opposite mismatch, a dataset holding ids at or above the vocabulary
size (tokenized with another tokenizer), is not looked for: finding it means reading every
token. Every bad prefix is reported, each naming its config key, the file and what would do.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

import numpy as np

from megatron.config import Config
from megatron.data.indexed_dataset import validate_pair
from megatron.data.indexed_format import IndexedDatasetError, data_path, index_path
from megatron.preflight import ERROR, OK, Finding, register
from megatron.preflight.tokenizer import TokenizerLoadError, load_tokenizer

NAME = "datasets"
# Worker scripts that read `cfg.data`'s datasets (generate.py and eval.py read none).
DATA_SCRIPTS = ("train.py",)
PREPROCESS = "tools/preprocess_data.py"


def named_prefixes(data_cfg) -> dict[str, list[str]]:
    """{prefix: [config keys naming it]}: `data_path` and every `*_data_paths` list (train,
    valid and test sets, their labels, and any further kind of set the data group gains).
    `data_path` is left out when `train_data_paths` is set, as the builders then ignore it."""
    named: dict[str, list[str]] = {}
    for field in dataclasses.fields(data_cfg):
        value = getattr(data_cfg, field.name)
        if value is None:
            continue
        if field.name == "data_path" and not data_cfg.train_data_paths:
            named.setdefault(str(value), []).append("data_path")
        elif field.name.endswith("_data_paths"):
            for i, prefix in enumerate(value):
                named.setdefault(str(prefix), []).append(f"{field.name}[{i}]")
    return named


def near_matches(prefix: str, limit: int = 3) -> list[str]:
    """Prefixes of pairs beside `prefix` whose names start like it or resemble it."""
    path = Path(prefix)
    folder = path.parent
    if not folder.is_dir():
        return []
    names = sorted(
        {p.name[: -len(p.suffix)] for p in folder.iterdir() if p.suffix in (".bin", ".idx")}
    )
    extended = [n for n in names if n.startswith(path.name) and n != path.name]
    similar = difflib.get_close_matches(path.name, names, n=limit, cutoff=0.6)
    chosen = list(dict.fromkeys(extended + similar))[:limit]
    return [str(folder / name) for name in chosen]


def missing_problem(prefix: str) -> str | None:
    """What is missing of the pair at `prefix`, with near matches; None if both files exist."""
    idx, bin_ = index_path(prefix), data_path(prefix)
    if idx.is_file() and bin_.is_file():
        return None
    if idx.is_file() or bin_.is_file():
        have, lack = (idx, bin_) if idx.is_file() else (bin_, idx)
        return f"{lack} does not exist ({have.name} does); re-run {PREPROCESS} to write both"
    if not idx.parent.is_dir():
        where = f"the folder {idx.parent} does not exist"
    else:
        where = f"neither {bin_.name} nor {idx.name} exists in {idx.parent}"
    close = near_matches(prefix)
    hint = f"; did you mean {' or '.join(close)}?" if close else "."
    return (
        f"no dataset at {prefix}: {where}{hint} A dataset is a .bin/.idx pair written by "
        f"{PREPROCESS} --output-prefix PREFIX; give PREFIX without the extension"
    )


def dtype_problem(dtype: np.dtype, vocab_size: int, tokenizer_type: str) -> str | None:
    """Why a dataset of `dtype` cannot hold the ids of a `vocab_size` vocabulary, or None."""
    if not np.issubdtype(dtype, np.integer):
        return f"its dtype {dtype.name} cannot hold token ids; re-run {PREPROCESS}"
    capacity = int(np.iinfo(dtype).max) + 1
    if vocab_size <= capacity:
        return None
    return (
        f"its dtype {dtype.name} holds ids below {capacity:,}, but the tokenizer "
        f"({tokenizer_type}) has {vocab_size:,} tokens: this data was tokenized with another "
        f"tokenizer; re-run {PREPROCESS} with this one (it writes int32 from 65,500 tokens)"
    )


def _vocab_size(cfg: Config) -> int | None:
    try:
        return load_tokenizer(cfg.tokenizer).vocab_size
    except TokenizerLoadError:
        return None  # the tokenizer check reports it


def check_prefix(prefix: str, keys: list[str], vocab_size: int | None, cfg: Config) -> Finding:
    """One finding for one prefix: an error saying what is wrong and what to do, or OK."""
    where = f"{', '.join(keys)}: {prefix}"
    problem = missing_problem(prefix)
    if problem:
        return Finding(NAME, ERROR, f"{where}: {problem}")
    try:
        pair = validate_pair(prefix)
    except IndexedDatasetError as err:
        return Finding(NAME, ERROR, f"{where}: {err}; re-run {PREPROCESS} to rebuild the pair")
    # Reward sets hold values per sample, not token ids: no vocabulary to fit.
    if vocab_size is not None and not all("reward" in key for key in keys):
        problem = dtype_problem(pair.dtype, vocab_size, cfg.tokenizer.tokenizer_type)
        if problem:
            return Finding(NAME, ERROR, f"{where}: {problem}")
    return Finding(
        NAME,
        OK,
        f"{where}: {pair.num_docs:,} documents, {pair.dtype.name}, {pair.bin_bytes:,} bytes",
    )


@register(NAME, reads_worker_files=True)
def check_datasets(cfg: Config, script: str) -> list[Finding]:
    """Every dataset prefix `train.py` will read is a whole pair whose dtype fits the vocab."""
    if Path(script).name not in DATA_SCRIPTS:
        return []
    if cfg.data.data_impl == "dummy":
        return [Finding(NAME, OK, "data_impl: dummy: synthetic tokens, no files to check")]
    named = named_prefixes(cfg.data)
    if not named:
        message = (
            "no data: set data_path (with split) or train_data_paths, or data_impl: dummy for "
            "synthetic tokens"
        )
        return [Finding(NAME, ERROR, message)]
    vocab_size = _vocab_size(cfg)
    return [check_prefix(prefix, keys, vocab_size, cfg) for prefix, keys in named.items()]
