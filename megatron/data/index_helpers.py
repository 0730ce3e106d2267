"""Sample-index and blending-index builders: compiled (csrc/data_helpers.cpp) or numpy.

`index_helpers()` returns the compiled implementation when the extension
`megatron.data._index_helpers` is built (setup.py, or `python -m megatron.data.helpers_build`),
else the numpy one; `MEGATRON_DATA_HELPERS=numpy` forces numpy. Both give identical arrays;
tests compare them.
"""

from __future__ import annotations

import functools
import importlib
import os

import numpy as np

INT32_MAX = np.iinfo(np.int32).max


def sample_idx_needs_int64(num_samples: int) -> bool:
    """GPT-NeoX's rule: int32 rows unless the array would hold 2**31 entries or more."""
    return 2 * (num_samples + 1) >= INT32_MAX


def _check_sample_idx_inputs(sizes, doc_idx, seq_length: int, num_samples: int):
    sizes = np.ascontiguousarray(sizes, dtype=np.int32)
    doc_idx = np.ascontiguousarray(doc_idx, dtype=np.int32)
    if seq_length < 1 or num_samples < 0:
        raise ValueError(
            f"seq_length must be >= 1 and num_samples >= 0, got {seq_length}, {num_samples}"
        )
    if doc_idx.size and (doc_idx.min() < 0 or doc_idx.max() >= sizes.size):
        raise ValueError(f"doc_idx refers to documents outside [0, {sizes.size})")
    needed = num_samples * seq_length + 1
    available = int(sizes[doc_idx].sum(dtype=np.int64)) if doc_idx.size else 0
    if num_samples and available < needed:
        raise ValueError(
            f"{num_samples} samples of {seq_length} + 1 tokens need {needed} tokens; the "
            f"documents hold {available}"
        )
    return sizes, doc_idx


class NumpyIndexHelpers:
    """Pure numpy implementation (vectorised sample index, Python-loop blending index)."""

    name = "numpy"

    def build_sample_idx(self, sizes, doc_idx, seq_length: int, num_samples: int) -> np.ndarray:
        """(num_samples + 1, 2) rows of (index into doc_idx, offset): see data_helpers.cpp."""
        sizes, doc_idx = _check_sample_idx_inputs(sizes, doc_idx, seq_length, num_samples)
        dtype = np.int64 if sample_idx_needs_int64(num_samples) else np.int32
        lengths = sizes[doc_idx].astype(np.int64)  # (n_doc_idx,)
        ends = np.cumsum(lengths)  # exclusive end position of each document in the stream
        starts = np.arange(num_samples + 1, dtype=np.int64) * seq_length  # (num_samples + 1,)
        # The document holding each start position: the first whose end lies beyond it
        # (which skips empty documents, as the compiled walk does).
        doc_i = np.searchsorted(ends, starts, side="right")
        out = np.empty((num_samples + 1, 2), dtype=dtype)
        out[:, 0] = doc_i
        if num_samples:
            out[:, 1] = starts - (ends[doc_i] - lengths[doc_i])
        out[0] = (0, 0)  # the walk starts at (0, 0) even when the first document is empty
        return out

    def build_blending_indices(self, weights, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Dataset of each sample and its index within that dataset (greedy, exact)."""
        w = [float(x) for x in np.asarray(weights, dtype=np.float64)]
        if not 1 <= len(w) <= 255:
            raise ValueError(f"blending needs 1 to 255 datasets, got {len(w)}")
        counts = [0] * len(w)
        dataset_index = np.empty(size, np.uint8)
        sample_index = np.empty(size, np.int64)
        datasets = range(1, len(w))
        for i in range(size):
            seen = float(i) if i > 1 else 1.0
            best, best_error = 0, w[0] * seen - counts[0]
            for d in datasets:
                error = w[d] * seen - counts[d]
                if error > best_error:
                    best, best_error = d, error
            dataset_index[i] = best
            sample_index[i] = counts[best]
            counts[best] += 1
        return dataset_index, sample_index


class CompiledIndexHelpers:
    """The pybind11 extension built from csrc/data_helpers.cpp."""

    name = "compiled"

    def __init__(self, module):
        self._module = module

    def build_sample_idx(self, sizes, doc_idx, seq_length: int, num_samples: int) -> np.ndarray:
        sizes, doc_idx = _check_sample_idx_inputs(sizes, doc_idx, seq_length, num_samples)
        return self._module.build_sample_idx(
            sizes, doc_idx, seq_length, num_samples, sample_idx_needs_int64(num_samples)
        )

    def build_blending_indices(self, weights, size: int) -> tuple[np.ndarray, np.ndarray]:
        return self._module.build_blending_indices(np.asarray(weights, np.float64), int(size))


@functools.cache
def index_helpers() -> NumpyIndexHelpers | CompiledIndexHelpers:
    """The compiled helpers when the extension is importable, else numpy."""
    if os.environ.get("MEGATRON_DATA_HELPERS") == "numpy":
        return NumpyIndexHelpers()
    try:
        module = importlib.import_module("megatron.data._index_helpers")
    except ImportError:
        return NumpyIndexHelpers()
    return CompiledIndexHelpers(module)
