"""Memory-mapped reader for `.bin/.idx` pairs (Megatron/GPT-NeoX mmap format)."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class ValidPair:
    """A `.bin/.idx` pair that passed `validate_pair`: its index arrays (mapped, not read)."""

    dtype: np.dtype
    index_map: np.memmap
    sizes: np.ndarray  # int32[n_items]: tokens per item
    pointers: np.ndarray  # int64[n_items]: byte offset of each item in the .bin
    doc_idx: np.ndarray  # int64[n_docs + 1]: first item of each document, then n_items
    bin_bytes: int

    @property
    def num_docs(self) -> int:
        return len(self.doc_idx) - 1


def validate_pair(prefix: str | Path) -> ValidPair:
    """Check that `{prefix}.bin/.idx` is one whole pair, reading no tokens.

    The header (magic, version, dtype code, and the .idx length its counts imply), the ends of
    doc_idx (0 and the item count) and the .bin length (the last item's pointer plus its size
    must end the file) are checked; only the first and last index entries are touched, so this
    takes milliseconds whatever the corpus size. Raises IndexedDatasetError naming the file.
    """
    idx_file, bin_file = index_path(prefix), data_path(prefix)
    header = read_header(idx_file)
    buf = np.memmap(idx_file, mode="r", dtype=np.uint8)
    sizes = np.frombuffer(buf, np.int32, header.n_items, header.sizes_offset)
    pointers = np.frombuffer(buf, np.int64, header.n_items, header.pointers_offset)
    doc_idx = np.frombuffer(buf, np.int64, header.n_docs, header.doc_idx_offset)
    if doc_idx[0] != 0 or doc_idx[-1] != header.n_items:
        raise IndexedDatasetError(
            f"{idx_file}: corrupt doc_idx: it must start at 0 and end at the item count "
            f"{header.n_items}, found {int(doc_idx[0])} .. {int(doc_idx[-1])}"
        )
    expected = 0
    if header.n_items:
        expected = int(pointers[-1]) + int(sizes[-1]) * header.dtype.itemsize
    try:
        actual = bin_file.stat().st_size
    except FileNotFoundError:
        raise IndexedDatasetError(f"{bin_file}: data file not found (its .idx exists)") from None
    if actual != expected:
        what = "truncated" if actual < expected else "longer than its index says"
        raise IndexedDatasetError(
            f"{bin_file}: {what}: {actual} bytes, but {idx_file.name} describes {expected} "
            f"({header.n_items} items of {header.dtype.name}); the pair does not belong together"
        )
    return ValidPair(header.dtype, buf, sizes, pointers, doc_idx, actual)


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
        pair = validate_pair(self.prefix)
        if self.warmup:
            _warm_up(index_path(self.prefix))
        self.dtype, self._idx_mmap = pair.dtype, pair.index_map
        self.sizes, self.pointers, self.doc_idx = pair.sizes, pair.pointers, pair.doc_idx
        bin_file = data_path(self.prefix)
        if self.warmup:
            _warm_up(bin_file)
        # np.memmap cannot map an empty file; an empty dataset has no tokens to map.
        self._bin = np.memmap(bin_file, mode="r", dtype=self.dtype) if pair.bin_bytes else None

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
