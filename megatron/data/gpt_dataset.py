"""GPT dataset: documents made into samples of `seq_length + 1` tokens by the `pack_impl`
(`packed`: cut across boundaries; `pack_until_overflow`, `unpacked`: whole documents, padded),
with the label, reward and reference log-prob datasets aligned to the tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.mapped_dataset import MappedSamples, check_aligned, label_masker


class GPTDataset(MappedSamples):
    """Sample `i` is `{"text": int64[seq_length + 1]}`, plus, each of the same length:

    * `"label"` (int64) from a label dataset: per-token targets, -100 where the loss is masked.
      Padded packings always give it (the tokens themselves without label data) with -100 on
      the padding, which holds token 0;
    * `"reward"` (float32) from a reward dataset (KTO: the per-token desirability);
    * `"ref"` (float32) from a reference log-prob dataset (precomputed by `generate.py`).

    With `packed` (GPT-NeoX's default) samples run across document boundaries (documents end
    with the EOD token the preprocessing appended), consecutive samples share one token, and
    their order is the seeded shuffle of `index_mapping`; `len()` counts every sample of the
    epochs needed to supply `num_samples`, so it is at least `num_samples`. With the padded
    packings (`packing.py`) `len()` is `num_samples`.
    """

    def __init__(
        self,
        name: str,
        indexed_dataset: MMapIndexedDataset,
        documents: np.ndarray,
        num_samples: int,
        seq_length: int,
        seed: int,
        cache_prefix: str | Path | None = None,
        label_dataset: MMapIndexedDataset | None = None,
        use_shared_fs: bool = True,
        pack_impl: str = "packed",
        allow_chopped: bool = True,
        reward_dataset: MMapIndexedDataset | None = None,
        ref_dataset: MMapIndexedDataset | None = None,
    ):
        self.name = name
        self.indexed_dataset = self.main = indexed_dataset
        self.label_dataset = label_dataset
        self.reward_dataset = reward_dataset
        self.ref_dataset = ref_dataset
        self.seq_length = seq_length
        self.pack_impl = pack_impl
        check_aligned(indexed_dataset, label_dataset, "label")
        check_aligned(indexed_dataset, reward_dataset, "reward")
        check_aligned(indexed_dataset, ref_dataset, "reference log-prob")
        rules = dict(
            sizes=[indexed_dataset.sizes],
            allow_chopped=allow_chopped,
            all_masked=label_masker([label_dataset]) if label_dataset is not None else None,
        )
        self._map(documents, num_samples, seed, cache_prefix, use_shared_fs, rules)

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        i = self._sample_index(idx)
        text, label = self._tokens_and_labels(self.indexed_dataset, self.label_dataset, i)
        sample = {"text": text}
        if label is not None:
            sample["label"] = label
        if self.reward_dataset is not None:
            sample["reward"] = self._read(self.reward_dataset, i, np.float32, 0.0)
        if self.ref_dataset is not None:
            sample["ref"] = self._read(self.ref_dataset, i, np.float32, 0.0)
        return sample
