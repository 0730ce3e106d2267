"""What the GPT and pairwise datasets share: index mappings over one split's documents, and
reading a sample's span out of any of the aligned datasets (text, labels, rewards, reference
log-probs), cut or padded to `seq_length + 1` as the `pack_impl` asks."""

from __future__ import annotations

import numpy as np

from megatron.data.index_mapping import build_index_mappings, load_index_mappings
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.packing import LABEL_PAD, PACK_IMPLS, DocumentRules, fit


def check_documents(indexed: MMapIndexedDataset, documents: np.ndarray) -> None:
    n_items = len(indexed)
    if documents.size and (documents.min() < 0 or documents.max() >= n_items):
        raise ValueError(f"{indexed.prefix}: documents outside [0, {n_items}) requested")


def check_aligned(main: MMapIndexedDataset, other: MMapIndexedDataset | None, what: str) -> None:
    """`other` (labels, rewards, reference log-probs of `main`) has a value per token of
    every document of `main`; raises naming both files."""
    if other is not None and not np.array_equal(other.sizes, main.sizes):
        raise ValueError(
            f"{what} dataset {other.prefix} does not match {main.prefix}: every document must "
            f"have one {what} value per token ({len(other)} vs {len(main)} documents)"
        )


def label_masker(label_sets: list[MMapIndexedDataset]):
    """`all_masked(doc, n)`: True when, on some side, the first `n` labels of `doc` are all
    -100 (GPT-NeoX skips such a document: it would carry no loss)."""

    def all_masked(doc: int, n: int) -> bool:
        return any(bool(np.all(labels.get(doc)[:n] == LABEL_PAD)) for labels in label_sets)

    return all_masked


class MappedSamples:
    """Index mappings of one split and the reader of a sample's span. Subclasses set
    `self.main` (the dataset whose documents are indexed) before calling `_map`."""

    name: str
    seq_length: int
    pack_impl: str

    def _map(self, documents, num_samples, seed, cache_prefix, use_shared_fs, rules_kw):
        if self.pack_impl not in PACK_IMPLS:
            raise ValueError(f"pack_impl: {self.pack_impl!r} is not one of {', '.join(PACK_IMPLS)}")
        documents = np.asarray(documents)
        check_documents(self.main, documents)
        self.num_documents = int(documents.size)
        rules = None
        if self.pack_impl != "packed":
            rules = DocumentRules(
                documents=documents, seq_length=self.seq_length, where=str(self.main.prefix),
                **rules_kw,
            )  # fmt: skip
        mappings = build_index_mappings(
            self.name,
            cache_prefix if cache_prefix is not None else self.main.prefix,
            self.main.sizes,
            documents,
            num_samples,
            self.seq_length,
            seed,
            use_shared_fs=use_shared_fs,
            pack_impl=self.pack_impl,
            rules=rules,
        )
        self.doc_idx = mappings.doc_idx
        self.sample_idx = mappings.sample_idx
        self.shuffle_idx = mappings.shuffle_idx
        self.num_epochs = mappings.num_epochs
        self._paths = mappings.paths
        self.index_built = mappings.built

    def __getstate__(self):
        # DataLoader workers get the dataset pickled: send the .npy paths, not the arrays.
        state = dict(self.__dict__)
        for kind in self._paths:
            del state[kind]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.update(load_index_mappings(self._paths))

    def __len__(self) -> int:
        return self.shuffle_idx.shape[0]

    def _sample_index(self, idx: int) -> int:
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"{self.name} dataset: sample {idx} out of range for {n} samples")
        return int(self.shuffle_idx[idx])

    def _gather(self, dataset: MMapIndexedDataset, idx: int) -> np.ndarray:
        """The span of sample `idx` (unshuffled) in `dataset`: from row idx of sample_idx
        through the first token at row idx + 1, as GPT-NeoX reads it."""
        doc_f, offset_f = (int(x) for x in self.sample_idx[idx])
        doc_l, offset_l = (int(x) for x in self.sample_idx[idx + 1])
        if doc_f == doc_l:
            return dataset.get(int(self.doc_idx[doc_f]), offset_f, offset_l - offset_f + 1)
        parts = [dataset.get(int(self.doc_idx[doc_f]), offset_f)]
        parts += [dataset.get(int(self.doc_idx[i])) for i in range(doc_f + 1, doc_l)]
        if doc_l < len(self.doc_idx):  # the last pack_until_overflow sample has no successor
            doc = int(self.doc_idx[doc_l])
            parts.append(dataset.get(doc, 0, min(offset_l + 1, int(dataset.sizes[doc]))))
        return np.concatenate(parts)

    def _read(self, dataset, idx: int, dtype, pad) -> np.ndarray:
        values = self._gather(dataset, idx).astype(dtype)
        if self.pack_impl == "packed":
            return values
        return fit(values, self.seq_length + 1, pad)

    def _tokens_and_labels(self, text, labels, idx: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (padded with 0) and labels (padded with -100). Padded packings always give
        labels, the tokens themselves where no label data is given, so padding never carries
        loss (GPT-NeoX pads bare text with -100 instead, which no embedding can take)."""
        tokens = self._gather(text, idx).astype(np.int64)
        label = None if labels is None else self._gather(labels, idx).astype(np.int64)
        if self.pack_impl == "packed":
            return tokens, label
        if label is None:
            label = tokens
        n = self.seq_length + 1
        return fit(tokens, n, 0), fit(label, n, LABEL_PAD)
