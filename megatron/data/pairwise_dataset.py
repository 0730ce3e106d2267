"""Pairwise (preference) dataset: the chosen (`pos`) and rejected (`neg`) sides of each pair
are document `d` of two datasets with aligned documents, made into samples together."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.mapped_dataset import MappedSamples, check_aligned, label_masker


class PairwiseDataset(MappedSamples):
    """Sample `i` is `{"pos", "neg", "pos_label", "neg_label"}` (int64[seq_length + 1] each),
    plus `"pos_ref"` and `"neg_ref"` (float32) with reference log-prob datasets: GPT-NeoX's
    keys. Both sides take the same documents, so a sample's pos and neg are the two sides of
    the same pairs. Labels come from the label datasets (-100 where no loss), else are the
    tokens themselves; padding is token 0 with label -100.

    Only the padded packings apply (`pack_until_overflow`, `unpacked`; a pair's packing length
    is its longer side); `packed` would cut the two sides at different places, and GPT-NeoX
    refuses it too.
    """

    def __init__(
        self,
        name: str,
        pos: MMapIndexedDataset,
        neg: MMapIndexedDataset,
        documents: np.ndarray,
        num_samples: int,
        seq_length: int,
        seed: int,
        pack_impl: str = "unpacked",
        allow_chopped: bool = True,
        cache_prefix: str | Path | None = None,
        use_shared_fs: bool = True,
        pos_label: MMapIndexedDataset | None = None,
        neg_label: MMapIndexedDataset | None = None,
        pos_ref: MMapIndexedDataset | None = None,
        neg_ref: MMapIndexedDataset | None = None,
    ):
        if pack_impl == "packed":
            raise ValueError(
                f"{name}: pack_impl: packed cannot pair chosen and rejected sequences (it cuts "
                "them at different places); use pack_impl: unpacked or pack_until_overflow"
            )
        if len(pos) != len(neg):
            raise ValueError(
                f"pairwise {name} data: {pos.prefix} has {len(pos)} documents but {neg.prefix} "
                f"has {len(neg)}; document d of each must be the two sides of pair d"
            )
        if (pos_label is None) != (neg_label is None):
            given = pos_label if pos_label is not None else neg_label
            raise ValueError(
                f"pairwise {name} data: label dataset {given.prefix} has no counterpart for the "
                "other side; give both pos and neg label datasets, or neither"
            )
        if (pos_ref is None) != (neg_ref is None):
            raise ValueError(f"pairwise {name} data: give both pos and neg reference log-probs")
        for text, labels, ref in ((pos, pos_label, pos_ref), (neg, neg_label, neg_ref)):
            check_aligned(text, labels, "label")
            check_aligned(text, ref, "reference log-prob")
        self.name = name
        self.pos, self.neg = pos, neg
        self.main = pos
        self.pos_label, self.neg_label = pos_label, neg_label
        self.pos_ref, self.neg_ref = pos_ref, neg_ref
        self.seq_length = seq_length
        self.pack_impl = pack_impl
        labels = [pos_label, neg_label] if pos_label is not None else None
        rules = dict(
            sizes=[pos.sizes, neg.sizes],
            allow_chopped=allow_chopped,
            all_masked=label_masker(labels) if labels else None,
            pairwise=True,
        )
        self._map(documents, num_samples, seed, cache_prefix, use_shared_fs, rules)

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        i = self._sample_index(idx)
        sample = {}
        sample["pos"], sample["pos_label"] = self._tokens_and_labels(self.pos, self.pos_label, i)
        sample["neg"], sample["neg_label"] = self._tokens_and_labels(self.neg, self.neg_label, i)
        if self.pos_ref is not None:
            sample["pos_ref"] = self._read(self.pos_ref, i, np.float32, 0.0)
            sample["neg_ref"] = self._read(self.neg_ref, i, np.float32, 0.0)
        return sample
