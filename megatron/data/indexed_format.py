"""The Megatron/GPT-NeoX mmap `.idx` format: header layout, dtype codes, validation.

An indexed dataset is a pair of files sharing a prefix:

* `{prefix}.bin`: the tokens of every item, back to back, in one dtype.
* `{prefix}.idx`: a 34-byte header, then three arrays::

      magic    9 bytes   b"MMIDIDX\\x00\\x00"
      version  uint64    1
      dtype    uint8     a code from DTYPE_CODES
      n_items  uint64    number of items (len(sizes) == len(pointers))
      n_docs   uint64    len(doc_idx) (= number of documents + 1)
      sizes    int32[n_items]    tokens per item
      pointers int64[n_items]    byte offset of each item in the .bin
      doc_idx  int64[n_docs]     item index where each document starts, then n_items

All integers are little-endian. This is byte-identical to what GPT-NeoX and Megatron-LM write, so
corpora preprocessed by either load unchanged and ours load there.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# magic, version, dtype code, n_items, n_docs
HEADER_STRUCT = struct.Struct("<9sQBQQ")
HEADER_SIZE = HEADER_STRUCT.size  # 34

# GPT-NeoX's table. Megatron-LM core swaps 6/7 (float64/float32); token data never uses them.
DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float32,
    7: np.float64,
    8: np.uint16,
}

# GPT-NeoX writes uint16 below this vocab size (not 65536: a margin for added tokens).
UINT16_VOCAB_LIMIT = 65500


class IndexedDatasetError(ValueError):
    """A `.bin/.idx` pair is missing, truncated or not in the mmap format."""


def dtype_code(dtype) -> int:
    """The format's code for a numpy dtype; raises for dtypes the format cannot hold."""
    dtype = np.dtype(dtype)
    for code, candidate in DTYPE_CODES.items():
        if np.dtype(candidate) == dtype:
            return code
    valid = ", ".join(np.dtype(d).name for d in DTYPE_CODES.values())
    raise IndexedDatasetError(
        f"dtype {dtype.name} cannot be stored in an .idx file; valid: {valid}"
    )


def best_fitting_dtype(vocab_size: int | None) -> type[np.generic]:
    """uint16 when every token id fits (vocab < 65,500), else int32 (as GPT-NeoX decides)."""
    if vocab_size is not None and vocab_size < UINT16_VOCAB_LIMIT:
        return np.uint16
    return np.int32


def index_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.idx")


def data_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.bin")


def encode_header(dtype, n_items: int, n_docs: int) -> bytes:
    """The 34-byte header for an index of `n_items` sizes/pointers and `n_docs` doc_idx entries."""
    return HEADER_STRUCT.pack(MAGIC, VERSION, dtype_code(dtype), n_items, n_docs)


@dataclass(frozen=True)
class IndexHeader:
    """The decoded header of an `.idx` file, with the byte offsets of its three arrays."""

    dtype: np.dtype
    n_items: int
    n_docs: int

    @property
    def sizes_offset(self) -> int:
        return HEADER_SIZE

    @property
    def pointers_offset(self) -> int:
        return HEADER_SIZE + 4 * self.n_items

    @property
    def doc_idx_offset(self) -> int:
        return HEADER_SIZE + 12 * self.n_items

    @property
    def index_file_size(self) -> int:
        return HEADER_SIZE + 12 * self.n_items + 8 * self.n_docs


def read_header(path: str | Path) -> IndexHeader:
    """Read and validate the header of the `.idx` file at `path`.

    Raises IndexedDatasetError naming the file when it is missing, too short, has the wrong
    magic (not an mmap index, or a legacy `cached`/`lazy` one), an unsupported version or an
    unknown dtype code, or when its length disagrees with the counts in its header.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_SIZE)
    except FileNotFoundError:
        raise IndexedDatasetError(f"{path}: index file not found") from None
    except OSError as e:
        raise IndexedDatasetError(f"{path}: cannot read index file ({e.strerror})") from None
    if len(raw) < len(MAGIC) or raw[: len(MAGIC)] != MAGIC:
        raise IndexedDatasetError(
            f"{path}: wrong magic {raw[: len(MAGIC)]!r}, expected {MAGIC!r}: not a Megatron mmap "
            "index (legacy 'cached'/'lazy' indexes are not supported; re-run preprocessing)"
        )
    if len(raw) < HEADER_SIZE:
        raise IndexedDatasetError(
            f"{path}: truncated header ({len(raw)} bytes, a header is {HEADER_SIZE})"
        )
    _, version, code, n_items, n_docs = HEADER_STRUCT.unpack(raw)
    if version != VERSION:
        raise IndexedDatasetError(
            f"{path}: unsupported index version {version}; only version {VERSION} is supported"
        )
    if code not in DTYPE_CODES:
        raise IndexedDatasetError(
            f"{path}: unknown dtype code {code}; valid codes: {sorted(DTYPE_CODES)}"
        )
    header = IndexHeader(np.dtype(DTYPE_CODES[code]), n_items, n_docs)
    actual = path.stat().st_size
    if actual != header.index_file_size:
        what = "truncated" if actual < header.index_file_size else "has trailing bytes"
        raise IndexedDatasetError(
            f"{path}: {what}: {actual} bytes, but its header ({n_items} items, {n_docs} "
            f"doc_idx entries) needs {header.index_file_size}"
        )
    if n_docs < 1:
        raise IndexedDatasetError(f"{path}: doc_idx is empty; it must hold at least [0]")
    return header
