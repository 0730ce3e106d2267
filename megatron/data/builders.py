"""Train/valid/test datasets from the data settings: one prefix split by `split`, or explicit
per-split prefixes (text, or pos/neg pairs with `dataset_impl: pairwise`), blended by weight.

    datasets = build_train_valid_test_datasets(cfg, num_samples_from_config(cfg))
    train, valid, test = datasets  # GPTDataset, PairwiseDataset, BlendableDataset or None
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from megatron.data.blendable_dataset import (
    BlendableDataset,
    neox_num_samples,
    normalize_weights,
    weights_by_num_docs,
)
from megatron.data.dummy_dataset import build_dummy_datasets
from megatron.data.sources import gpt_source, open_prefix, split_sources

SPLIT_NAMES = ("train", "valid", "test")


@dataclass(frozen=True)
class DataSettings:
    """Everything dataset building reads; `from_config(cfg)` fills it from `cfg.data` & co."""

    seq_length: int
    seed: int
    data_path: str | None = None
    split: str = "969,30,1"
    train_data_paths: tuple[str, ...] | None = None
    valid_data_paths: tuple[str, ...] | None = None
    test_data_paths: tuple[str, ...] | None = None
    train_data_weights: tuple[float, ...] | None = None
    valid_data_weights: tuple[float, ...] | None = None
    test_data_weights: tuple[float, ...] | None = None
    train_label_data_paths: tuple[str, ...] | None = None
    valid_label_data_paths: tuple[str, ...] | None = None
    test_label_data_paths: tuple[str, ...] | None = None
    train_reward_data_paths: tuple[str, ...] | None = None
    valid_reward_data_paths: tuple[str, ...] | None = None
    test_reward_data_paths: tuple[str, ...] | None = None
    dataset_impl: str = "gpt2"
    pos_train_data_paths: tuple[str, ...] | None = None
    pos_train_label_data_paths: tuple[str, ...] | None = None
    neg_train_data_paths: tuple[str, ...] | None = None
    neg_train_label_data_paths: tuple[str, ...] | None = None
    pos_valid_data_paths: tuple[str, ...] | None = None
    pos_valid_label_data_paths: tuple[str, ...] | None = None
    neg_valid_data_paths: tuple[str, ...] | None = None
    neg_valid_label_data_paths: tuple[str, ...] | None = None
    pos_test_data_paths: tuple[str, ...] | None = None
    pos_test_label_data_paths: tuple[str, ...] | None = None
    neg_test_data_paths: tuple[str, ...] | None = None
    neg_test_label_data_paths: tuple[str, ...] | None = None
    pack_impl: str = "packed"
    allow_chopped: bool = True
    precompute_model_name: str | None = None
    weight_by_num_documents: bool = False
    weighted_sampler_alpha: float = 1.0
    data_cache_path: str | None = None
    use_shared_fs: bool = True
    mmap_warmup: bool = False
    data_impl: str = "mmap"
    vocab_size: int | None = None  # token ids of `data_impl: dummy` lie below it

    @classmethod
    def from_config(cls, cfg, seed: int | None = None) -> DataSettings:
        data = cfg.data
        fields = {
            name: getattr(data, name)
            for name in cls.__dataclass_fields__
            if name not in ("seq_length", "seed") and hasattr(data, name)
        }
        fields["vocab_size"] = getattr(cfg.model, "padded_vocab_size", None)
        if fields.get("dataset_impl") == "gpt":  # the spelling of GPT-NeoX's gpt2
            fields["dataset_impl"] = "gpt2"
        for name, value in fields.items():
            if isinstance(value, list):
                fields[name] = tuple(value)
        seed = cfg.training.seed if seed is None else seed
        return cls(seq_length=cfg.model.seq_length, seed=seed, **fields)


def parse_split(split: str, num_docs: int) -> list[int]:
    """Document boundaries [0, a, b, num_docs] of train/valid/test for a `split` such as
    `949,50,1` (or `949/50/1`; missing parts are 0; weights are normalised)."""
    parts = str(split).replace("/", ",").split(",")
    try:
        weights = [float(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"split: {split!r} is not numbers separated by ',' (e.g. 949,50,1)"
        ) from None
    if len(weights) > 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"split: {split!r} needs 1-3 non-negative numbers with a positive sum")
    weights = normalize_weights(weights + [0.0] * (3 - len(weights)), "split")
    bounds = [0]
    for w in weights:
        bounds.append(bounds[-1] + int(round(w * num_docs)))
    diff = bounds[-1] - num_docs  # rounding drift is taken from the later splits
    return [0] + [max(0, b - diff) for b in bounds[1:]]


def _cache_prefix(prefix: str, settings: DataSettings) -> str:
    if settings.data_cache_path:
        return str(Path(settings.data_cache_path) / Path(prefix).name)
    return prefix


def _build_explicit(name: str, num_samples: int, settings: DataSettings):
    sources = split_sources(name, settings)
    if not sources or num_samples <= 0:
        return None
    weights = getattr(settings, f"{name}_data_weights")
    if settings.weight_by_num_documents:
        weights = weights_by_num_docs(
            [s.main.num_docs for s in sources], settings.weighted_sampler_alpha
        )
    elif weights is None:
        weights = [1.0] * len(sources)
    elif len(weights) != len(sources):
        paths = "pos_" if settings.dataset_impl == "pairwise" else ""
        raise ValueError(
            f"{name}_data_weights has {len(weights)} entries but {paths}{name}_data_paths has "
            f"{len(sources)}"
        )
    weights = normalize_weights(weights, f"{name}_data_weights")
    # GPT-NeoX sizes every dataset of explicit paths as a blend, a lone one too: its share
    # plus 0.5%, which sets its epochs and so its shuffle.
    counts = neox_num_samples(weights, num_samples)
    datasets = [
        s.make(name, np.arange(len(s.main), dtype=np.int32), n, _cache_prefix(s.prefix, settings))
        for s, n in zip(sources, counts)
    ]
    if len(datasets) == 1:  # a blend of one reads it in order
        return datasets[0]
    return BlendableDataset(datasets, weights, num_samples)


def _build_from_split(num_samples: list[int], settings: DataSettings):
    source = gpt_source(settings, settings.data_path, "data_path")
    bounds = parse_split(settings.split, len(source.main))
    cache_prefix = _cache_prefix(settings.data_path, settings)
    out = []
    for i, name in enumerate(SPLIT_NAMES):
        documents = np.arange(bounds[i], bounds[i + 1], dtype=np.int32)
        if documents.size == 0 or num_samples[i] <= 0:
            out.append(None)
            continue
        out.append(source.make(name, documents, num_samples[i], cache_prefix))
    return tuple(out)


def build_datasets(settings: DataSettings, train_valid_test_num_samples):
    """(train, valid, test) datasets; a split with no data or no requested samples is None."""
    num_samples = [int(n) for n in train_valid_test_num_samples]
    if settings.data_impl == "dummy":
        return build_dummy_datasets(
            num_samples, settings.seq_length, settings.vocab_size, settings.seed
        )
    if settings.train_data_paths or settings.dataset_impl == "pairwise":
        return tuple(_build_explicit(n, k, settings) for n, k in zip(SPLIT_NAMES, num_samples))
    if not settings.data_path:
        raise ValueError("no data: set `data_path` (with `split`) or `train_data_paths`")
    return _build_from_split(num_samples, settings)


def build_train_valid_test_datasets(cfg, train_valid_test_num_samples, seed: int | None = None):
    """(train, valid, test) for the resolved config `cfg` (duck-typed: cfg.data, cfg.model,
    cfg.training). Collective under torch.distributed (index files are built by one rank)."""
    return build_datasets(DataSettings.from_config(cfg, seed), train_valid_test_num_samples)


def train_valid_test_num_samples(
    train_iters: int, eval_interval: int, eval_iters: int, global_batch_size: int
) -> list[int]:
    """Samples each split must supply: every train step, every evaluation (one per
    `eval_interval` and one at the end) and the final test evaluation."""
    evaluations = train_iters // eval_interval + 1 if eval_interval else 1
    return [
        train_iters * global_batch_size,
        evaluations * eval_iters * global_batch_size,
        eval_iters * global_batch_size,
    ]


def num_samples_from_config(cfg) -> list[int]:
    t = cfg.training
    if t.train_iters is None:
        raise ValueError("train_iters is not set; set it (or train_epochs, which derives it)")
    return train_valid_test_num_samples(
        t.train_iters, t.eval_interval, t.eval_iters, t.train_batch_size
    )


def train_samples_per_epoch(cfg) -> int:
    """Training samples in one pass over the training data (to turn `train_epochs` into
    `train_iters`): for blended data, the sum over the datasets."""
    s = DataSettings.from_config(cfg)
    if s.pack_impl != "packed" or s.dataset_impl != "gpt2":
        raise ValueError(
            "train_epochs needs dataset_impl: gpt2 with pack_impl: packed (as in GPT-NeoX); "
            "set train_iters instead"
        )
    if s.data_impl == "dummy":
        raise ValueError(
            "train_epochs with data_impl: dummy: synthetic data has no epochs; set train_iters"
        )
    if s.train_data_paths:
        sizes = [open_prefix(p, "train_data_paths", s).num_tokens for p in s.train_data_paths]
    else:
        indexed = open_prefix(s.data_path, "data_path", s)
        bounds = parse_split(s.split, len(indexed))
        sizes = [int(indexed.sizes[bounds[0] : bounds[1]].sum(dtype=np.int64))]
    return sum(max(0, (n - 1) // s.seq_length) for n in sizes)


def iters_for_epochs(train_epochs: int, samples_per_epoch: int, global_batch_size: int) -> int:
    return math.ceil(train_epochs * samples_per_epoch / global_batch_size)
