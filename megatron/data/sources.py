"""The datasets one blend member reads, opened from the `data` group (`DataConfig`): for
`dataset_impl: gpt2` a text prefix with its label, reward and reference log-prob datasets; for
`pairwise` the pos and neg prefixes with theirs. Reference log-probs are found by GPT-NeoX's
naming rule: `{prefix}_{precompute_model_name}` beside each text (or pos/neg) prefix.

The `kind` arguments are the `kinds.DatasetKind` building the member: its `data` group, and
the `seq_length` and `seed` of the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from megatron.data.gpt_dataset import GPTDataset
from megatron.data.indexed_dataset import MMapIndexedDataset, indexed_dataset_exists
from megatron.data.pairwise_dataset import PairwiseDataset


def open_prefix(prefix: str, key: str, data) -> MMapIndexedDataset:
    """The `.bin/.idx` pair at `prefix`; raises naming the config key `key`."""
    if data.data_impl not in ("mmap", "infer"):
        raise ValueError(
            f"data_impl: {data.data_impl!r} is not supported; only 'mmap' datasets are read"
        )
    if not indexed_dataset_exists(prefix):
        hint = ""
        if indexed_dataset_exists(f"{prefix}_text_document"):
            hint = f" (did you mean {prefix}_text_document?)"
        raise FileNotFoundError(f"{key}: no {prefix}.bin/.idx pair{hint}")
    return MMapIndexedDataset(prefix, warmup=data.mmap_warmup)


def ref_prefix(prefix: str, model_name: str) -> str:
    """Where GPT-NeoX keeps the reference log-probs of the data at `prefix`."""
    return f"{prefix}_{model_name}"


def open_ref(prefix: str, key: str, data) -> MMapIndexedDataset | None:
    """The reference log-probs of `prefix` when `precompute_model_name` is set."""
    name = data.precompute_model_name
    if not name:
        return None
    path = ref_prefix(prefix, name)
    if not indexed_dataset_exists(path):
        raise FileNotFoundError(
            f"{key}: precompute_model_name: {name} names reference log-probs at {path}.bin/.idx, "
            "which do not exist; write them with generate.py (text_gen_type: precompute) or "
            "unset precompute_model_name"
        )
    return open_prefix(path, f"{key} (precompute_model_name)", data)


def per_path(data, key: str, n: int, of: str) -> list:
    """The list `key` of `data`, one entry per path of `of`, or n Nones when unset."""
    values = getattr(data, key)
    if values is None:
        return [None] * n
    if len(values) != n:
        raise ValueError(f"{key} has {len(values)} entries but {of} has {n}; give one per path")
    return list(values)


def _maybe_open(prefix, key, data):
    return None if prefix is None else open_prefix(prefix, key, data)


@dataclass
class Source:
    """One blend member: `main` (whose documents are indexed and counted) and how to make its
    dataset for `(name, documents, num_samples, cache_prefix)`."""

    prefix: str
    main: MMapIndexedDataset
    make: Callable[[str, np.ndarray, int, str], Any]


def gpt_source(kind, prefix: str, key: str, label=None, reward=None) -> Source:
    """A text prefix with its optional label/reward prefixes and, by name, its references."""
    d = kind.data
    indexed = open_prefix(prefix, key, d)
    extra = dict(
        label_dataset=_maybe_open(label, key.replace("_data_", "_label_data_"), d),
        reward_dataset=_maybe_open(reward, key.replace("_data_", "_reward_data_"), d),
        ref_dataset=open_ref(prefix, key, d),
    )

    def make(name, documents, num_samples, cache_prefix):
        return GPTDataset(
            name, indexed, documents, num_samples, kind.seq_length, kind.seed,
            cache_prefix=cache_prefix, use_shared_fs=d.use_shared_fs,
            pack_impl=d.pack_impl, allow_chopped=d.allow_chopped, **extra,
        )  # fmt: skip

    return Source(prefix, indexed, make)


def gpt_sources(kind, split: str) -> list[Source]:
    """The blend members of `split` (train, valid or test) from `{split}_data_paths`."""
    d = kind.data
    prefixes = getattr(d, f"{split}_data_paths") or ()
    n = len(prefixes)
    labels = per_path(d, f"{split}_label_data_paths", n, f"{split}_data_paths")
    rewards = per_path(d, f"{split}_reward_data_paths", n, f"{split}_data_paths")
    return [
        gpt_source(kind, p, f"{split}_data_paths[{i}]", label, reward)
        for i, (p, label, reward) in enumerate(zip(prefixes, labels, rewards))
    ]


def pairwise_source(kind, split: str, i: int, pos: str, neg: str, labels) -> Source:
    """Pair `i` of `split`: pos/neg prefixes, optional (pos, neg) label prefixes, references."""
    d = kind.data
    keys = {side: f"{side}_{split}_data_paths[{i}]" for side in ("pos", "neg")}
    sides = {"pos": open_prefix(pos, keys["pos"], d)}
    sides["neg"] = open_prefix(neg, keys["neg"], d)
    extra = {}
    for side, prefix in (("pos", pos), ("neg", neg)):
        extra[f"{side}_ref"] = open_ref(prefix, keys[side], d)
    for side, label in zip(("pos", "neg"), labels):
        extra[f"{side}_label"] = _maybe_open(label, f"{side}_{split}_label_data_paths[{i}]", d)

    def make(name, documents, num_samples, cache_prefix):
        return PairwiseDataset(
            name, sides["pos"], sides["neg"], documents, num_samples, kind.seq_length,
            kind.seed, pack_impl=d.pack_impl, allow_chopped=d.allow_chopped,
            cache_prefix=cache_prefix, use_shared_fs=d.use_shared_fs, **extra,
        )  # fmt: skip

    return Source(pos, sides["pos"], make)


def pairwise_sources(kind, split: str) -> list[Source]:
    """The pairs of `split` from `pos_{split}_data_paths` and `neg_{split}_data_paths`."""
    d = kind.data
    pos = getattr(d, f"pos_{split}_data_paths") or ()
    n = len(pos)
    neg = per_path(d, f"neg_{split}_data_paths", n, f"pos_{split}_data_paths")
    if n and None in neg:
        raise ValueError(f"pos_{split}_data_paths needs neg_{split}_data_paths, one per path")
    pos_labels = per_path(d, f"pos_{split}_label_data_paths", n, f"pos_{split}_data_paths")
    neg_labels = per_path(d, f"neg_{split}_label_data_paths", n, f"pos_{split}_data_paths")
    return [
        pairwise_source(kind, split, i, p, q, (lp, lq))
        for i, (p, q, lp, lq) in enumerate(zip(pos, neg, pos_labels, neg_labels))
    ]
