"""DeMo's compression: a chunked DCT of a tensor, the top-k coefficients of each chunk, and back.

DeMo (Peng, Quesnelle, Kingma 2024) extracts the "fast" components of a momentum tensor in
the frequency domain. A tensor is cut into chunks: a vector into pieces of `c` elements, a
matrix into `c1 × c2` tiles, where each chunk side is the largest divisor of that dimension
not above `compression_chunk` (so every tensor divides evenly; a prime size gives chunks of
1). Each chunk is transformed by the orthonormal DCT-II (along both axes of a tile); of its
`c` (or `c1·c2`) coefficients only the `compression_topk` largest in magnitude are kept,
as (index within the chunk, value) pairs. Tensors of more than two dimensions are treated as
the matrix (shape[0], rest).

Decompression scatters the pairs back into a zero spectrum; pairs from several ranks that
name the same coefficient are averaged (DeMo's and Psyche's `scatter_reduce(..., "mean")`);
the inverse DCT gives the tensor.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch


def largest_divisor_at_most(n: int, target: int) -> int:
    """The largest divisor of `n` that is <= `target` (DeMo's `_get_smaller_split`)."""
    if n <= target:
        return n
    return max(d for d in range(1, target + 1) if n % d == 0)


@lru_cache(maxsize=64)
def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix (n, n): row k is basis k, `coefficients = D @ x`."""
    k = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    d = torch.cos(math.pi * (2 * j + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d


def index_dtype(chunk_elements: int) -> torch.dtype:
    """The narrowest integer type that holds an index within a chunk (what travels)."""
    if chunk_elements <= 256:
        return torch.uint8
    if chunk_elements <= 2**15:
        return torch.int16
    return torch.int32


class ChunkedDCT:
    """Chunk layout and DCT of one tensor shape (identical on every data-parallel rank)."""

    def __init__(self, shape: torch.Size, target_chunk: int, dtype: torch.dtype, device):
        self.shape = tuple(shape)
        if len(self.shape) == 0:
            self.matrix = None
            sides = (1,)
        elif len(self.shape) == 1:
            self.matrix = None
            sides = self.shape
        else:
            self.matrix = (self.shape[0], math.prod(self.shape[1:]))
            sides = self.matrix
        self.chunks = tuple(largest_divisor_at_most(s, target_chunk) for s in sides)
        self.bases = [dct_matrix(c).to(dtype=dtype, device=device) for c in self.chunks]
        self.chunk_elements = math.prod(self.chunks)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Spectrum of each chunk: (chunks..., chunk_elements)."""
        if self.matrix is None:
            (c,) = self.chunks
            (d,) = self.bases
            return x.reshape(-1, c) @ d.T  # (n / c, c)
        (r, s), (c1, c2) = self.matrix, self.chunks
        d1, d2 = self.bases
        tiles = x.reshape(r // c1, c1, s // c2, c2)  # (a, c1, b, c2)
        spectrum = torch.einsum("ajbl,kj,ml->abkm", tiles, d1, d2)  # (a, b, c1, c2)
        return spectrum.reshape(r // c1, s // c2, c1 * c2)

    def decode(self, spectrum: torch.Tensor) -> torch.Tensor:
        """Inverse of `encode`: a tensor of the original shape."""
        if self.matrix is None:
            (d,) = self.bases
            return (spectrum @ d).reshape(self.shape)
        (r, s), (c1, c2) = self.matrix, self.chunks
        d1, d2 = self.bases
        tiles = spectrum.reshape(r // c1, s // c2, c1, c2)  # (a, b, c1, c2)
        x = torch.einsum("abkm,kj,ml->ajbl", tiles, d1, d2)  # (a, c1, b, c2)
        return x.reshape(self.shape)

    def top_k(self, spectrum: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices, values) of the `k` largest-magnitude coefficients of each chunk."""
        k = max(1, min(k, self.chunk_elements))
        idx = torch.topk(spectrum.abs(), k, dim=-1, sorted=False).indices
        return idx, torch.gather(spectrum, -1, idx)

    def scatter(self, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """A spectrum holding `values` at `idx` (the mean where an index repeats), else 0."""
        spectrum = torch.zeros(
            (*idx.shape[:-1], self.chunk_elements), dtype=values.dtype, device=values.device
        )
        return spectrum.scatter_reduce_(-1, idx, values, reduce="mean", include_self=False)
