"""How documents become samples (`pack_impl`), as GPT-NeoX's three implementations do.

* `packed` (GPT-NeoX's default): documents are shuffled into one token stream cut every
  `seq_length` tokens, so samples run across document boundaries and never pad
  (`index_mapping.py` builds its arrays).
* `pack_until_overflow`: whole documents, in a seeded shuffle reshuffled at every pass, are
  appended to a sample until the next would take it past `seq_length + 1` tokens; that one
  starts the next sample. A sample is padded to `seq_length + 1`.
* `unpacked`: one document per sample, in document order (cycling), padded.

With these two, a document longer than `seq_length + 1` tokens is truncated ("chopped"), or
skipped when `allow_chopped: false`, and a document whose labels mask every token of the
first sample window is skipped (it would carry no loss). For a preference pair the longer side
counts. The arrays keep GPT-NeoX's shape: `sample_idx` rows `(first doc_idx entry, 0)`, so
sample `i` is documents `doc_idx[row_i : row_{i+1}]` plus the first token of the next one, as
GPT-NeoX's reader takes it, then cut or padded to `seq_length + 1` (`fit`).

Where GPT-NeoX crashes or reads the wrong split, we differ, deliberately: a skipped document at
the end of a pass wraps around like any other (GPT-NeoX indexes past the end); the documents
are those of the split (GPT-NeoX takes item ids 0..n-1 whatever the split); the last sample of
`pack_until_overflow` has no following document to lend it a token (GPT-NeoX hits an index
error and serves another sample); every one of the `num_samples` samples is served (GPT-NeoX's
`len()` is one short); and for a pair `allow_chopped: false` skips the pairs with a side over
`seq_length + 1` tokens, as for single documents (GPT-NeoX's pairwise check is inverted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

PACK_IMPLS = ("packed", "pack_until_overflow", "unpacked")
LABEL_PAD = -100  # GPT-NeoX's ignore index: a padded label carries no loss
TOKEN_PAD = 0  # any id does: its label is LABEL_PAD


@dataclass(frozen=True)
class DocumentRules:
    """What a padded packing needs to know about the documents of one split.

    `sizes` holds one size array per side (one for text, two for a pos/neg pair);
    `all_masked(doc, n)` says whether every label among the first `n` tokens of item `doc` is
    -100 on some side (None without label data).
    """

    documents: np.ndarray
    sizes: Sequence[np.ndarray]
    seq_length: int
    allow_chopped: bool = True
    all_masked: Callable[[int, int], bool] | None = None
    pairwise: bool = False
    where: str = "dataset"

    def usable(self, doc: int, label_window: int) -> bool:
        if not self.allow_chopped and any(int(s[doc]) > self.seq_length + 1 for s in self.sizes):
            return False
        return self.all_masked is None or not self.all_masked(doc, label_window)

    def length(self, doc: int) -> int:
        return max(int(s[doc]) for s in self.sizes)

    def no_usable_document(self) -> ValueError:
        chopped = "" if self.allow_chopped else f" no longer than {self.seq_length + 1} tokens"
        return ValueError(
            f"{self.where}: none of its {self.documents.size} documents is{chopped} with a "
            "label that carries loss; every document would be skipped (check the label "
            "dataset, or set allow_chopped: true)"
        )


class PackUntilOverflow:
    name = "pack_until_overflow"
    label_window_extra = 1  # GPT-NeoX looks at the first seq_length + 1 labels

    def build(self, rules: DocumentRules, num_samples: int, seed: int):
        """(doc_idx, sample_idx, shuffle_idx), drawn from `RandomState(seed)` in GPT-NeoX's
        order: the sample shuffle first, then the document order of each pass."""
        rng = np.random.RandomState(seed)
        shuffle_idx = np.arange(num_samples)
        rng.shuffle(shuffle_idx)
        n_docs = rules.documents.size
        order = np.arange(n_docs)
        rng.shuffle(order)
        window = rules.seq_length + self.label_window_extra
        doc_idx, starts = [], []
        running, pos, skipped = 0, 0, 0
        while len(starts) < num_samples:
            doc = int(rules.documents[order[pos]])
            if rules.usable(doc, window):
                skipped = 0
                length = rules.length(doc)
                if running == 0 or running + length > rules.seq_length + 1:
                    starts.append(len(doc_idx))
                    running = length
                else:
                    running += length
                doc_idx.append(doc)
            else:
                skipped += 1
                # a pass holds every document once, so a usable one shows within two passes
                if skipped > 2 * n_docs:
                    raise rules.no_usable_document()
            pos += 1
            if pos == n_docs:
                pos = 0
                rng.shuffle(order)
        starts.append(len(doc_idx))
        return _arrays(doc_idx, starts, shuffle_idx)


class Unpacked:
    name = "unpacked"
    label_window_extra = 0  # GPT-NeoX looks at the first seq_length labels

    def __init__(self, pairwise: bool = False):
        self.pairwise = pairwise

    def build(self, rules: DocumentRules, num_samples: int, seed: int):
        """One document per sample, documents in order, cycling: `num_samples + 1` of them
        (the last lends its first token). GPT-NeoX's pairwise reader serves only the first
        pass's rows, each about `num_samples / n_docs` times; its text reader every row once."""
        rng = np.random.RandomState(seed)
        n_docs = rules.documents.size
        if self.pairwise:
            shuffle_idx = np.arange(num_samples) % n_docs
        else:
            shuffle_idx = np.arange(num_samples)
        rng.shuffle(shuffle_idx)
        window = rules.seq_length + self.label_window_extra
        doc_idx, pos, skipped = [], 0, 0
        while len(doc_idx) <= num_samples:
            doc = int(rules.documents[pos])
            if rules.usable(doc, window):
                doc_idx.append(doc)
                skipped = 0
            else:
                skipped += 1
                if skipped > n_docs:
                    raise rules.no_usable_document()
            pos = (pos + 1) % n_docs
        return _arrays(doc_idx, range(num_samples + 1), shuffle_idx)


def _arrays(doc_idx, starts, shuffle_idx):
    sample_idx = np.zeros((len(starts), 2), dtype=np.int64)
    sample_idx[:, 0] = np.asarray(starts, dtype=np.int64)
    return np.asarray(doc_idx, dtype=np.int64), sample_idx, np.asarray(shuffle_idx, np.int64)


def padded_packing(pack_impl: str, pairwise: bool = False):
    """The builder of a padded `pack_impl`; raises naming the valid values."""
    if pack_impl == "pack_until_overflow":
        return PackUntilOverflow()
    if pack_impl == "unpacked":
        return Unpacked(pairwise)
    raise ValueError(
        f"pack_impl: {pack_impl!r} has no padded packing; valid: pack_until_overflow, unpacked"
    )


def fit(values: np.ndarray, length: int, pad) -> np.ndarray:
    """`values` cut or padded with `pad` to `length` (GPT-NeoX's overflow/underflow rule)."""
    if values.size >= length:
        return values[:length]
    return np.concatenate([values, np.full(length - values.size, pad, dtype=values.dtype)])
