"""The dataset kinds, a registry keyed by name: what a sample is and which `cfg.data` keys say
where its data lies. `gpt2` (`dataset_impl: gpt2`, or `gpt`) reads token windows from one
`data_path` split by `split` or from explicit `*_data_paths`; `pairwise` reads chosen/rejected
pairs from explicit `pos_*`/`neg_*_data_paths`; `dummy` (`data_impl: dummy`, whatever
`dataset_impl` says) draws synthetic tokens and reads no files.

    kind = dataset_kind(cfg.data, seq_length=2048, seed=1234, vocab_size=50304)
    train, valid, test = kind.build([train_samples, valid_samples, test_samples])

Adding a kind is a `DatasetKind` subclass and its entry in `DATASET_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from megatron.config.groups.data import DataConfig
from megatron.data.blendable_dataset import (
    BlendableDataset,
    neox_num_samples,
    normalize_weights,
    weights_by_num_docs,
)
from megatron.data.dummy_dataset import build_dummy_datasets
from megatron.data.sources import gpt_source, gpt_sources, open_prefix, pairwise_sources

SPLIT_NAMES = ("train", "valid", "test")
SYNTHETIC = "dummy"  # the `data_impl` value that replaces every file-reading kind


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


@dataclass(frozen=True)
class DatasetKind:
    """One kind of sample: builds (train, valid, test) from the `data` group and the run's
    facts outside it (`vocab_size`: the padded vocabulary, which synthetic tokens lie below)."""

    data: DataConfig
    seq_length: int
    seed: int
    vocab_size: int | None = None

    def build(self, num_samples: list[int]) -> tuple:
        """(train, valid, test); a split with no data or no requested samples is None."""
        raise NotImplementedError

    def samples_per_epoch(self) -> int:
        """Training samples in one pass over the training data (for `train_epochs`)."""
        raise ValueError(
            "train_epochs needs dataset_impl: gpt2 with pack_impl: packed (as in GPT-NeoX); "
            "set train_iters instead"
        )

    def cache_prefix(self, prefix: str) -> str:
        """Where the index arrays of the data at `prefix` are cached."""
        if self.data.data_cache_path:
            return str(Path(self.data.data_cache_path) / Path(prefix).name)
        return prefix


class ExplicitPaths(DatasetKind):
    """A kind read from per-split lists of prefixes, blended by `*_data_weights` (or by
    document counts with `weight_by_num_documents`)."""

    def sources(self, split: str) -> list:
        """The blend members (`sources.Source`) of `split`."""
        raise NotImplementedError

    def paths_key(self, split: str) -> str:
        """The key listing the prefixes of `split`, one per weight."""
        raise NotImplementedError

    def build(self, num_samples):
        return tuple(self.build_split(n, k) for n, k in zip(SPLIT_NAMES, num_samples))

    def build_split(self, name: str, num_samples: int):
        sources = self.sources(name)
        if not sources or num_samples <= 0:
            return None
        d = self.data
        weights = getattr(d, f"{name}_data_weights")
        if d.weight_by_num_documents:
            weights = weights_by_num_docs(
                [s.main.num_docs for s in sources], d.weighted_sampler_alpha
            )
        elif weights is None:
            weights = [1.0] * len(sources)
        elif len(weights) != len(sources):
            raise ValueError(
                f"{name}_data_weights has {len(weights)} entries but {self.paths_key(name)} has "
                f"{len(sources)}"
            )
        weights = normalize_weights(weights, f"{name}_data_weights")
        # GPT-NeoX sizes every dataset of explicit paths as a blend, a lone one too: its share
        # plus 0.5%, which sets its epochs and so its shuffle.
        counts = neox_num_samples(weights, num_samples)
        datasets = [
            s.make(name, np.arange(len(s.main), dtype=np.int32), n, self.cache_prefix(s.prefix))
            for s, n in zip(sources, counts)
        ]
        if len(datasets) == 1:  # a blend of one reads it in order
            return datasets[0]
        return BlendableDataset(datasets, weights, num_samples)


class GPTKind(ExplicitPaths):
    """`GPTDataset` windows of `seq_length + 1` tokens (with labels, rewards, references)."""

    def sources(self, split):
        return gpt_sources(self, split)

    def paths_key(self, split):
        return f"{split}_data_paths"

    def build(self, num_samples):
        if self.data.train_data_paths:
            return super().build(num_samples)
        if not self.data.data_path:
            raise ValueError("no data: set `data_path` (with `split`) or `train_data_paths`")
        source = gpt_source(self, self.data.data_path, "data_path")
        bounds = parse_split(self.data.split, len(source.main))
        cache_prefix = self.cache_prefix(self.data.data_path)
        out = []
        for i, name in enumerate(SPLIT_NAMES):
            documents = np.arange(bounds[i], bounds[i + 1], dtype=np.int32)
            if documents.size == 0 or num_samples[i] <= 0:
                out.append(None)
                continue
            out.append(source.make(name, documents, num_samples[i], cache_prefix))
        return tuple(out)

    def samples_per_epoch(self):
        """For blended data, the sum over the datasets: `(tokens - 1) // seq_length` each."""
        d = self.data
        if d.pack_impl != "packed":
            return super().samples_per_epoch()
        if d.train_data_paths:
            sizes = [open_prefix(p, "train_data_paths", d).num_tokens for p in d.train_data_paths]
        else:
            indexed = open_prefix(d.data_path, "data_path", d)
            bounds = parse_split(d.split, len(indexed))
            sizes = [int(indexed.sizes[bounds[0] : bounds[1]].sum(dtype=np.int64))]
        return sum(max(0, (n - 1) // self.seq_length) for n in sizes)


class PairwiseKind(ExplicitPaths):
    """`PairwiseDataset` samples: a chosen and a rejected side with aligned documents."""

    def sources(self, split):
        return pairwise_sources(self, split)

    def paths_key(self, split):
        return f"pos_{split}_data_paths"


class DummyKind(DatasetKind):
    """`DummyDataset`: seeded synthetic tokens below `vocab_size`; no files."""

    def build(self, num_samples):
        return build_dummy_datasets(num_samples, self.seq_length, self.vocab_size, self.seed)

    def samples_per_epoch(self):
        raise ValueError(
            "train_epochs with data_impl: dummy: synthetic data has no epochs; set train_iters"
        )


DATASET_KINDS: dict[str, type[DatasetKind]] = {
    "gpt2": GPTKind,
    "pairwise": PairwiseKind,
    SYNTHETIC: DummyKind,
}


def kind_name(data: DataConfig) -> str:
    """The `DATASET_KINDS` key of `data`: `data_impl: dummy`, else `dataset_impl` (`gpt`, the
    issue's spelling of GPT-NeoX's `gpt2`, read as `gpt2`)."""
    if data.data_impl == SYNTHETIC:
        return SYNTHETIC
    return "gpt2" if data.dataset_impl == "gpt" else data.dataset_impl


def dataset_kind(
    data: DataConfig, *, seq_length: int, seed: int, vocab_size: int | None = None
) -> DatasetKind:
    """The kind that builds `data`'s datasets, or a `ValueError` naming the valid values."""
    name = kind_name(data)
    if name not in DATASET_KINDS:
        valid = ", ".join(k for k in DATASET_KINDS if k != SYNTHETIC)
        raise ValueError(
            f"dataset_impl: {data.dataset_impl!r} is not one of {valid} "
            f"(or data_impl: {SYNTHETIC} for synthetic tokens)"
        )
    return DATASET_KINDS[name](data, seq_length, seed, vocab_size)
