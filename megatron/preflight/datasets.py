"""Pre-flight check of the datasets `train.py` will read: every prefix the config names is one
whole `.bin/.idx` pair, and its dtype can hold every id of the tokenizer's vocabulary.

The pair is judged by the reader's own validation (`validate_pair`: header, dtype code, the
ends of doc_idx, the `.bin` length the index describes), which reads the index's first and
last entries and the file sizes, never the tokens: milliseconds even for a terabyte corpus.
For the same reason the opposite mismatch, a dataset holding ids at or above the vocabulary
size (tokenized with another tokenizer), is not looked for: finding it means reading every
token. Every bad prefix is reported, each naming its config key, the file and what would do.

Post-training data is checked as a whole: the reference log-probs `precompute_model_name`
names beside every data prefix exist and hold floats, the pos and neg sides of each pair have
as many documents, and label, reward and reference datasets have a value per token of their
data (sizes compared from the indices).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

import numpy as np

from megatron.config import Config
from megatron.data.indexed_dataset import validate_pair
from megatron.data.indexed_format import IndexedDatasetError, data_path, index_path
from megatron.data.sources import ref_prefix
from megatron.preflight.findings import ERROR, OK, Finding, register
from megatron.preflight.tokenizer import TokenizerLoadError, load_tokenizer

NAME = "datasets"
REF_KEY = "precompute_model_name "
SPLITS = ("train", "valid", "test")
# The keys whose prefixes hold token ids that reference log-probs are computed for.
TEXT_KEYS = tuple(f"{s}_data_paths" for s in SPLITS) + tuple(
    f"{side}_{s}_data_paths" for s in SPLITS for side in ("pos", "neg")
)
# Worker scripts that read `cfg.data`'s datasets (generate.py and eval.py read none).
DATA_SCRIPTS = ("train.py",)
PREPROCESS = "tools/preprocess_data.py"


def named_prefixes(data_cfg) -> dict[str, list[str]]:
    """{prefix: [config keys naming it]}: `data_path` and every `*_data_paths` list (train,
    valid and test sets, their labels, and any further kind of set the data group gains).
    `data_path` is left out when `train_data_paths` is set, as the builders then ignore it."""
    named: dict[str, list[str]] = {}
    model = getattr(data_cfg, "precompute_model_name", None)
    for field in dataclasses.fields(data_cfg):
        value = getattr(data_cfg, field.name)
        if value is None:
            continue
        if field.name == "data_path" and not data_cfg.train_data_paths:
            named.setdefault(str(value), []).append("data_path")
            if model:
                named.setdefault(ref_prefix(str(value), model), []).append(REF_KEY + "(data_path)")
        elif field.name.endswith("_data_paths"):
            for i, prefix in enumerate(value):
                key = f"{field.name}[{i}]"
                named.setdefault(str(prefix), []).append(key)
                if model and field.name in TEXT_KEYS:
                    named.setdefault(ref_prefix(str(prefix), model), []).append(f"{REF_KEY}({key})")
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
    if any(key.startswith(REF_KEY) for key in keys) and not np.issubdtype(pair.dtype, np.floating):
        message = f"{where}: reference log-probs must be floats, found {pair.dtype.name}"
        return Finding(NAME, ERROR, message + "; re-run generate.py with text_gen_type: precompute")
    # Reward and reference sets hold values, not token ids: no vocabulary to fit.
    values = ("reward", REF_KEY)
    if vocab_size is not None and not all(any(v in key for v in values) for key in keys):
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
    found = [check_prefix(prefix, keys, vocab_size, cfg) for prefix, keys in named.items()]
    if all(f.level == OK for f in found):
        found += alignment_findings(cfg.data)
    return found


def _aligned_pairs(d):
    """(key, prefix, other key, other prefix, what must agree) for every dataset that must
    line up with another: pair sides by documents; labels, rewards, references by tokens."""
    model = getattr(d, "precompute_model_name", None)
    out = []
    for split in SPLITS:
        for side in ("", "pos_", "neg_"):
            data_key = f"{side}{split}_data_paths"
            for i, prefix in enumerate(getattr(d, data_key) or ()):
                key = f"{data_key}[{i}]"
                for kind in ("label", "reward"):
                    extra = getattr(d, f"{side}{split}_{kind}_data_paths", None)
                    if extra and i < len(extra):
                        out.append((key, prefix, f"{side}{split}_{kind}_data_paths[{i}]",
                                    extra[i], "tokens"))  # fmt: skip
                if model:
                    out.append((key, prefix, REF_KEY + f"({key})", ref_prefix(prefix, model),
                                "tokens"))  # fmt: skip
        neg = getattr(d, f"neg_{split}_data_paths") or ()
        for i, (pos, other) in enumerate(zip(getattr(d, f"pos_{split}_data_paths") or (), neg)):
            out.append((f"pos_{split}_data_paths[{i}]", pos, f"neg_{split}_data_paths[{i}]",
                        other, "documents"))  # fmt: skip
    if model and d.data_path and not d.train_data_paths:
        out.append(("data_path", d.data_path, REF_KEY + "(data_path)",
                    ref_prefix(d.data_path, model), "tokens"))  # fmt: skip
    return out


def alignment_findings(d) -> list[Finding]:
    """One error for each dataset that does not line up with its data (see `_aligned_pairs`)."""
    found = []
    for key, prefix, other_key, other, what in _aligned_pairs(d):
        a, b = validate_pair(prefix).sizes, validate_pair(other).sizes
        if len(a) != len(b):
            problem = f"{len(a):,} documents, but {other_key}: {other} has {len(b):,}"
        elif what == "tokens" and not np.array_equal(a, b):
            first = int(np.flatnonzero(a != b)[0])
            problem = (
                f"document {first} has {int(a[first])} tokens, but {other_key}: {other} has "
                f"{int(b[first])} values for it"
            )
        else:
            continue
        found.append(Finding(NAME, ERROR, f"{key}: {prefix}: {problem}; they must line up "
                             f"({what}): rebuild them together"))  # fmt: skip
    return found
