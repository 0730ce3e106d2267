"""The compiled sample/blending index helpers give exactly the numpy fallback's arrays."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from megatron.data.helpers_build import compile_helpers, load_compiled
from megatron.data.index_helpers import CompiledIndexHelpers, NumpyIndexHelpers


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The extension compiled from csrc/ into a temporary folder (about 5-10 s)."""
    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler (g++) to build csrc/data_helpers.cpp")
    path = compile_helpers(tmp_path_factory.mktemp("helpers"))
    return CompiledIndexHelpers(load_compiled(path))


def _random_case(rng):
    sizes = rng.integers(0, 30, size=int(rng.integers(1, 40))).astype(np.int32)
    sizes[rng.integers(0, sizes.size)] += 2  # at least 2 tokens in all
    epochs = int(rng.integers(1, 4))
    doc_idx = np.tile(np.arange(sizes.size, dtype=np.int32), epochs)
    rng.shuffle(doc_idx)
    seq_length = int(rng.integers(1, 20))
    num_samples = (epochs * int(sizes.sum()) - 1) // seq_length
    return sizes, doc_idx, seq_length, num_samples


def test_sample_idx_compiled_equals_numpy(compiled):
    rng = np.random.default_rng(1234)
    reference = NumpyIndexHelpers()
    for _ in range(300):  # includes empty documents, first document empty, exact boundaries
        case = _random_case(rng)
        a, b = compiled.build_sample_idx(*case), reference.build_sample_idx(*case)
        assert a.dtype == b.dtype == np.int32
        np.testing.assert_array_equal(a, b)


def test_sample_idx_semantics():
    """Row i points at token i * seq_length of the stream that doc_idx spells out."""
    sizes = np.array([3, 0, 5, 2], np.int32)
    doc_idx = np.array([2, 1, 0, 3], np.int32)  # stream: d2(5) d1(0) d0(3) d3(2) = 10 tokens
    idx = NumpyIndexHelpers().build_sample_idx(sizes, doc_idx, 3, 3)
    assert idx.tolist() == [[0, 0], [0, 3], [2, 1], [3, 1]]
    with pytest.raises(ValueError, match="need 13 tokens; the documents hold 10"):
        NumpyIndexHelpers().build_sample_idx(sizes, doc_idx, 3, 4)


def test_blending_compiled_equals_numpy(compiled):
    rng = np.random.default_rng(7)
    reference = NumpyIndexHelpers()
    for n in (1, 2, 3, 5):
        for _ in range(10):
            w = rng.random(n)
            w /= w.sum()
            a = compiled.build_blending_indices(w, 2000)
            b = reference.build_blending_indices(w, 2000)
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
    ties = np.array([0.25, 0.25, 0.5])
    a, b = compiled.build_blending_indices(ties, 97), reference.build_blending_indices(ties, 97)
    np.testing.assert_array_equal(a[0], b[0])


def test_runtime_falls_back_to_numpy(monkeypatch):
    import importlib

    from megatron.data import index_helpers as module

    real_import = importlib.import_module

    def no_extension(name, *args):
        if name == "megatron.data._index_helpers":
            raise ImportError(name)
        return real_import(name, *args)

    module.index_helpers.cache_clear()
    try:
        monkeypatch.setattr(importlib, "import_module", no_extension)
        assert module.index_helpers().name == "numpy"
        module.index_helpers.cache_clear()
        monkeypatch.setattr(importlib, "import_module", real_import)
        monkeypatch.setenv("MEGATRON_DATA_HELPERS", "numpy")
        assert module.index_helpers().name == "numpy"
    finally:
        module.index_helpers.cache_clear()
