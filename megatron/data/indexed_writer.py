"""Write a `.bin/.idx` pair in the mmap format, streaming, with an atomic finish.

Memory stays bounded whatever the corpus size: tokens go straight to the `.bin`, and the
per-item sizes and document boundaries are spilled to temporary files, because the `.idx`
needs them in front of everything else and can only be written once the last document is in.
Everything is written under temporary names; `finalize()` renames them, `.idx` last, so a
killed run never leaves a pair that looks whole.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from megatron.data.indexed_format import data_path, dtype_code, encode_header, index_path

_CHUNK = 1 << 22  # entries per pass when streaming the spilled arrays into the .idx


class IndexedDatasetWriter:
    """Append documents to `{prefix}.bin/.idx`; use as a context manager.

    On a clean exit the pair is finalized; on an exception the temporary files are removed and
    nothing under the final names is touched. `add_documents` is the fast path used by
    preprocessing (one flat token array and the per-document sizes); `add_item` +
    `end_document` follow the GPT-NeoX builder (several items, e.g. sentences, per document).
    """

    def __init__(self, prefix: str | Path, dtype):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        dtype_code(self.dtype)  # fail early on a dtype the format cannot hold
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        tag = f".tmp-{os.getpid()}"
        self._tmp = {
            "bin": Path(f"{self.prefix}.bin{tag}"),
            "sizes": Path(f"{self.prefix}.sizes{tag}"),
            "docs": Path(f"{self.prefix}.docs{tag}"),
            "idx": Path(f"{self.prefix}.idx{tag}"),
        }
        self._bin = open(self._tmp["bin"], "wb")
        self._sizes = open(self._tmp["sizes"], "wb")
        self._docs = open(self._tmp["docs"], "wb")
        self._docs.write(np.zeros(1, np.int64).tobytes())  # doc_idx starts with item 0
        self.n_items = 0
        self.n_docs = 0
        self.num_tokens = 0
        self._done = False

    # -- appending --------------------------------------------------------------------------
    def _as_tokens(self, tokens) -> np.ndarray:
        arr = np.asarray(tokens)
        if arr.dtype == self.dtype:
            return arr.reshape(-1)
        if arr.size and np.issubdtype(self.dtype, np.integer):
            info = np.iinfo(self.dtype)
            lo, hi = int(arr.min()), int(arr.max())
            if lo < info.min or hi > info.max:
                raise ValueError(
                    f"{self.prefix}: token ids in [{lo}, {hi}] do not fit the dataset dtype "
                    f"{self.dtype.name} [{info.min}, {info.max}]; pick a wider dtype"
                )
        return arr.astype(self.dtype).reshape(-1)

    def add_item(self, tokens) -> None:
        """Append one item (a document, or one sentence of it) without closing the document."""
        arr = self._as_tokens(tokens)
        self._bin.write(arr.tobytes())
        self._sizes.write(np.array([arr.size], np.int32).tobytes())
        self.n_items += 1
        self.num_tokens += arr.size

    def end_document(self) -> None:
        """Close the current document: the next item starts a new one."""
        self._docs.write(np.array([self.n_items], np.int64).tobytes())
        self.n_docs += 1

    def add_document(self, tokens) -> None:
        self.add_item(tokens)
        self.end_document()

    def add_documents(self, tokens, sizes) -> None:
        """Append one-item documents: `tokens` is their concatenation, `sizes` their lengths."""
        arr = self._as_tokens(tokens)
        sizes = np.asarray(sizes, dtype=np.int64)
        if int(sizes.sum()) != arr.size:
            raise ValueError(
                f"{self.prefix}: sizes sum to {int(sizes.sum())} but {arr.size} tokens were given"
            )
        self._bin.write(arr.tobytes())
        self._sizes.write(sizes.astype(np.int32).tobytes())
        ends = self.n_items + np.arange(1, sizes.size + 1, dtype=np.int64)
        self._docs.write(ends.tobytes())
        self.n_items += sizes.size
        self.n_docs += sizes.size
        self.num_tokens += arr.size

    def append_dataset(self, dataset) -> None:
        """Append every document of an `MMapIndexedDataset` of the same dtype (for merging)."""
        if dataset.dtype != self.dtype:
            raise ValueError(
                f"cannot merge {dataset.prefix} ({dataset.dtype.name}) into {self.prefix} "
                f"({self.dtype.name}): all inputs must share one dtype"
            )
        with open(data_path(dataset.prefix), "rb") as src:
            shutil.copyfileobj(src, self._bin, 1 << 24)
        self._sizes.write(np.asarray(dataset.sizes, np.int32).tobytes())
        self._docs.write((np.asarray(dataset.doc_idx[1:], np.int64) + self.n_items).tobytes())
        self.n_items += len(dataset.sizes)
        self.n_docs += len(dataset.doc_idx) - 1
        self.num_tokens += int(np.asarray(dataset.sizes, np.int64).sum())

    # -- finishing --------------------------------------------------------------------------
    def _write_index(self) -> None:
        itemsize = self.dtype.itemsize
        with open(self._tmp["idx"], "wb") as out:
            out.write(encode_header(self.dtype, self.n_items, self.n_docs + 1))
            with open(self._tmp["sizes"], "rb") as f:
                shutil.copyfileobj(f, out, 1 << 24)
            # pointers: byte offset of each item = running sum of sizes * itemsize
            sizes = np.memmap(self._tmp["sizes"], np.int32, "r") if self.n_items else []
            offset = 0
            for start in range(0, self.n_items, _CHUNK):
                chunk = np.asarray(sizes[start : start + _CHUNK], np.int64) * itemsize
                ends = np.cumsum(chunk)
                out.write((ends - chunk + offset).tobytes())
                offset += int(ends[-1])
            del sizes
            with open(self._tmp["docs"], "rb") as f:
                shutil.copyfileobj(f, out, 1 << 24)

    def finalize(self) -> None:
        """Write the `.idx` and move both files to their final names (`.idx` last)."""
        if self._done:
            return
        for f in (self._bin, self._sizes, self._docs):
            f.close()
        self._write_index()
        final_idx, final_bin = index_path(self.prefix), data_path(self.prefix)
        # An old .idx must not pair with the new .bin if we die between the two renames.
        final_idx.unlink(missing_ok=True)
        os.replace(self._tmp["bin"], final_bin)
        os.replace(self._tmp["idx"], final_idx)
        self._tmp["sizes"].unlink(missing_ok=True)
        self._tmp["docs"].unlink(missing_ok=True)
        self._done = True

    def abort(self) -> None:
        """Drop everything written so far; the final names are left untouched."""
        for f in (self._bin, self._sizes, self._docs):
            f.close()
        for path in self._tmp.values():
            path.unlink(missing_ok=True)
        self._done = True

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()
