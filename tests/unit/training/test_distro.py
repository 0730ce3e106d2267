"""DisTrO/DeMo (`megatron/training/optim/distro*.py`) against the paper's algorithm written out
plainly here: numpy, a DCT-II matrix built element by element from the cosine formula, tiles
cut by loops, top-k by sorting, and per-coefficient means over ranks by dictionaries.

`reference_steps` is also the reference of the 2-rank test (tests/parallel/test_distro.py).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
import scipy.fft
import torch

from megatron.training.optim.distro import Distro, load_rank_state, save_rank_state
from megatron.training.optim.distro_dct import ChunkedDCT


@cache
def dct_ii(n: int) -> np.ndarray:
    """Orthonormal DCT-II: X[k] = s_k Σ_j x[j] cos(π (2j + 1) k / 2n)."""
    d = np.zeros((n, n))
    for k in range(n):
        scale = math.sqrt(1.0 / n) if k == 0 else math.sqrt(2.0 / n)
        for j in range(n):
            d[k, j] = scale * math.cos(math.pi * (2 * j + 1) * k / (2 * n))
    return d


def chunk_side(n: int, target: int) -> int:
    return max(d for d in range(1, min(n, target) + 1) if n % d == 0)


def tiles(shape, target):
    """(row slice, column slice) of every chunk of a matrix shape, in row-major order."""
    rows, cols = shape
    c1, c2 = chunk_side(rows, target), chunk_side(cols, target)
    return [
        (slice(a, a + c1), slice(b, b + c2)) for a in range(0, rows, c1) for b in range(0, cols, c2)
    ]


def compress_tile(x: np.ndarray, k: int):
    """{flat coefficient index: value} of the k largest |DCT coefficients| of one tile."""
    y = dct_ii(x.shape[0]) @ x @ dct_ii(x.shape[1]).T
    flat = y.reshape(-1)
    keep = np.argsort(-np.abs(flat), kind="stable")[: min(k, flat.size)]
    return {int(i): float(flat[i]) for i in keep}


def decode_tile(coefficients: dict, shape) -> np.ndarray:
    y = np.zeros(shape[0] * shape[1])
    for i, v in coefficients.items():
        y[i] = v
    return dct_ii(shape[0]).T @ y.reshape(shape) @ dct_ii(shape[1])


def reference_steps(param, grads_per_rank, *, lr, wd, decay, chunk, topk, one_bit):
    """The parameter after DeMo steps; grads_per_rank[r][t] is rank r's gradient at step t.

    Also a mask of the elements whose decoded update was zero up to rounding at some step:
    ±1 coefficients can cancel exactly, and there the sign is rounding's choice.
    """
    p = np.array(param, dtype=np.float64)
    p2 = p.reshape(p.shape[0], -1) if p.ndim > 1 else p.reshape(-1, 1)  # a vector is a column
    tied = np.zeros(p2.shape, dtype=bool)
    deltas = [np.zeros_like(p2) for _ in grads_per_rank]
    for t in range(len(grads_per_rank[0])):
        p2 *= 1.0 - lr * wd
        sent = []
        for r, grads in enumerate(grads_per_rank):
            deltas[r] = decay * deltas[r] + lr * np.asarray(grads[t]).reshape(p2.shape)
            picks = {}
            for rows, cols in tiles(p2.shape, chunk):
                q = compress_tile(deltas[r][rows, cols], topk)
                deltas[r][rows, cols] -= decode_tile(q, deltas[r][rows, cols].shape)
                picks[(rows.start, cols.start)] = q
            sent.append(picks)
        for rows, cols in tiles(p2.shape, chunk):
            values: dict[int, list[float]] = {}
            for picks in sent:
                for i, v in picks[(rows.start, cols.start)].items():
                    values.setdefault(i, []).append((1.0 if v >= 0 else -1.0) if one_bit else v)
            merged = {i: sum(vs) / len(vs) for i, vs in values.items()}
            shape = (rows.stop - rows.start, cols.stop - cols.start)
            update = decode_tile(merged, shape)
            tied[rows, cols] |= np.abs(update) < 1e-9
            p2[rows, cols] -= lr * np.sign(update)
    return p2.reshape(p.shape), tied.reshape(p.shape)


def assert_matches_reference(actual, expected, tied, lr, steps):
    """Equal to rounding, except where the reference's update was a rounding-level zero."""
    assert tied.mean() < 0.1
    np.testing.assert_allclose(actual[~tied], expected[~tied], rtol=0, atol=1e-12)
    assert np.all(np.abs(actual - expected)[tied] <= 2 * lr * steps + 1e-12)


def test_chunked_dct_matches_scipy_and_round_trips():
    x = torch.randn(12, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    dct = ChunkedDCT(x.shape, 4, torch.float64, "cpu")
    assert dct.chunks == (4, 2)
    spectrum = dct.encode(x)  # (3, 5, 8)
    for a in range(3):
        for b in range(5):
            tile = x[4 * a : 4 * a + 4, 2 * b : 2 * b + 2].numpy()
            expected = scipy.fft.dctn(tile, type=2, norm="ortho").reshape(-1)
            np.testing.assert_allclose(spectrum[a, b].numpy(), expected, atol=1e-12)
    torch.testing.assert_close(dct.decode(spectrum), x, rtol=0, atol=1e-12)
    prime = torch.randn(13, dtype=torch.float64)
    assert ChunkedDCT(prime.shape, 4, torch.float64, "cpu").chunks == (1,)


@pytest.mark.parametrize("k", [1, 3, 16])
def test_compression_keeps_the_k_largest_coefficients_of_each_chunk(k):
    x = torch.randn(8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
    dct = ChunkedDCT(x.shape, 4, torch.float64, "cpu")
    idx, values = dct.top_k(dct.encode(x), k)
    approx = dct.decode(dct.scatter(idx, values)).numpy()
    for rows, cols in tiles((8, 8), 4):
        tile = x[rows, cols].numpy()
        expected = decode_tile(compress_tile(tile, k), tile.shape)
        np.testing.assert_allclose(approx[rows, cols], expected, atol=1e-12)
    if k == 16:  # every coefficient kept: lossless
        np.testing.assert_allclose(approx, x.numpy(), atol=1e-12)


def _grads(shape, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, dtype=torch.float64, generator=gen) for _ in range(steps)]


@pytest.mark.parametrize("one_bit", [True, False])
@pytest.mark.parametrize("shape", [(8, 12), (12,), (4, 2, 6)])
def test_one_rank_follows_the_papers_update(shape, one_bit):
    settings = dict(lr=0.01, wd=0.1, decay=0.9, chunk=4, topk=3, one_bit=one_bit)
    init = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    p = torch.nn.Parameter(init.clone())
    opt = Distro(
        [{"params": [p], "weight_decay": settings["wd"]}],
        lr=settings["lr"],
        compression_decay=settings["decay"],
        compression_chunk=settings["chunk"],
        compression_topk=settings["topk"],
        quantize_1bit=one_bit,
    )
    grads = _grads(shape, 4, seed=2)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    expected, tied = reference_steps(init.numpy(), [[g.numpy() for g in grads]], **settings)
    assert_matches_reference(p.detach().numpy(), expected, tied, settings["lr"], len(grads))


def test_per_rank_momenta_survive_a_checkpoint_and_rank_zeros_file_holds_none(tmp_path):
    p = torch.nn.Parameter(torch.zeros(4, 4))
    opt = Distro([p], lr=0.1, compression_chunk=2, compression_topk=1)
    p.grad = torch.arange(16.0).view(4, 4)
    opt.step()
    assert opt.state_dict()["state"] == {}  # what DeepSpeed saves on rank 0 only
    save_rank_state(opt, tmp_path, rank=3)
    q = torch.nn.Parameter(p.detach().clone())
    fresh = Distro([q], lr=0.1, compression_chunk=2, compression_topk=1)
    with pytest.raises(FileNotFoundError, match="no_load_optim"):
        load_rank_state(fresh, tmp_path, rank=2)
    load_rank_state(fresh, tmp_path, rank=3)
    assert torch.equal(fresh.state[q]["delta"], opt.state[p]["delta"])
    p.grad = q.grad = torch.ones(4, 4)
    opt.step()
    fresh.step()
    assert torch.equal(p, q)


@pytest.mark.parametrize(
    "bad", [{"compression_topk": 0}, {"compression_chunk": 2.5}, {"compression_decay": 1.5}]
)
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Distro([torch.nn.Parameter(torch.zeros(2))], **bad)
