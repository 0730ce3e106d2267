"""Memory-mapped reader for `.bin/.idx` pairs (Megatron/GPT-NeoX mmap format)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from megatron.data.indexed_format import (
    IndexedDatasetError,
    data_path,
    index_path,
    read_header,
)


def _warm_up(path: Path) -> None:
    """Read a file once so the page cache holds it before the first random access."""
    with open(path, "rb") as f:
        while f.read(1 << 26):
            pass


class MMapIndexedDataset:
    """Read-only view of `{prefix}.bin/.idx`: item `i` is a numpy array of its tokens.

    Items are what the writer appended with `add_item` (one per document for our
    preprocessing); `doc_idx` maps documents to items. Opening validates the header and that the
    `.bin` length matches what the index describes, so a truncated or mismatched pair fails here
    with the file and the problem named, not later inside a training step. The object pickles
    by path, so it can be handed to DataLoader worker processes.
    """

    def __init__(self, prefix: str | Path, warmup: bool = False):
        self.prefix = Path(prefix)
        self.warmup = warmup
        self._open()

    def _open(self) -> None:
        idx_file, bin_file = index_path(self.prefix), data_path(self.prefix)
        header = read_header(idx_file)
        self.dtype = header.dtype
        if self.warmup:
            _warm_up(idx_file)
        self._idx_mmap = np.memmap(idx_file, mode="r", dtype=np.uint8)
        buf = self._idx_mmap
        self.sizes = np.frombuffer(buf, np.int32, header.n_items, header.sizes_offset)
        self.pointers = np.frombuffer(buf, np.int64, header.n_items, header.pointers_offset)
        self.doc_idx = np.frombuffer(buf, np.int64, header.n_docs, header.doc_idx_offset)
        if self.doc_idx[0] != 0 or self.doc_idx[-1] != header.n_items:
            raise IndexedDatasetError(
                f"{idx_file}: corrupt doc_idx: it must start at 0 and end at the item count "
                f"{header.n_items}, found {int(self.doc_idx[0])} .. {int(self.doc_idx[-1])}"
            )
        expected = 0
        if header.n_items:
            expected = int(self.pointers[-1]) + int(self.sizes[-1]) * self.dtype.itemsize
        try:
            actual = bin_file.stat().st_size
        except FileNotFoundError:
            raise IndexedDatasetError(
                f"{bin_file}: data file not found (its .idx exists)"
            ) from None
        if actual != expected:
            what = "truncated" if actual < expected else "longer than its index says"
            raise IndexedDatasetError(
                f"{bin_file}: {what}: {actual} bytes, but {idx_file.name} describes {expected} "
                f"({header.n_items} items of {self.dtype.name}); the pair does not belong together"
            )
        if self.warmup:
            _warm_up(bin_file)
        # np.memmap cannot map an empty file; an empty dataset has no tokens to map.
        self._bin = np.memmap(bin_file, mode="r", dtype=self.dtype) if actual else None

    def __getstate__(self):
        return {"prefix": self.prefix, "warmup": False}

    def __setstate__(self, state):
        self.prefix, self.warmup = state["prefix"], state["warmup"]
        self._open()

    # -- access -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def num_docs(self) -> int:
        return len(self.doc_idx) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self.get(i) for i in range(*idx.indices(len(self)))]
        return self.get(idx)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens `offset : offset + length` of item `idx` (to its end when `length` is None)."""
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"{self.prefix}: item {idx} out of range for {n} items")
        size = int(self.sizes[idx])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(
                f"{self.prefix}: tokens [{offset}, {offset + length}) out of range for item {idx} "
                f"of {size} tokens"
            )
        start = int(self.pointers[idx]) // self.dtype.itemsize + offset
        if self._bin is None:
            return np.empty(0, self.dtype)
        return np.asarray(self._bin[start : start + length])

    def document(self, doc: int) -> np.ndarray:
        """All tokens of document `doc` (its items concatenated)."""
        first, last = int(self.doc_idx[doc]), int(self.doc_idx[doc + 1])
        if last - first == 1:
            return self.get(first)
        return np.concatenate(
            [self.get(i) for i in range(first, last)] or [np.empty(0, self.dtype)]
        )


def indexed_dataset_exists(prefix: str | Path) -> bool:
    return index_path(prefix).is_file() and data_path(prefix).is_file()
