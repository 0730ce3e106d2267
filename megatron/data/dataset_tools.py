"""Whole-dataset utilities behind tools/merge_datasets.py and tools/dataset_stats.py."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.indexed_writer import IndexedDatasetWriter


def merge_datasets(prefixes: list[str | Path], output_prefix: str | Path) -> MMapIndexedDataset:
    """Concatenate datasets (same dtype) into `output_prefix`, documents in input order."""
    if not prefixes:
        raise ValueError("merge_datasets: give at least one input prefix")
    datasets = [MMapIndexedDataset(p) for p in prefixes]
    dtypes = {d.dtype for d in datasets}
    if len(dtypes) > 1:
        found = ", ".join(f"{d.prefix} ({d.dtype.name})" for d in datasets)
        raise ValueError(f"merge_datasets: inputs have different dtypes: {found}")
    with IndexedDatasetWriter(output_prefix, datasets[0].dtype) as writer:
        for dataset in datasets:
            writer.append_dataset(dataset)
    return MMapIndexedDataset(output_prefix)


@dataclass(frozen=True)
class DatasetStats:
    prefix: str
    dtype: str
    documents: int
    items: int
    tokens: int
    min_length: int
    mean_length: float
    median_length: float
    max_length: int
    histogram: list[tuple[int, int, int]]  # (lower bound, upper bound exclusive, documents)

    def as_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        lines = [
            f"{self.prefix} ({self.dtype})",
            f"  documents {self.documents:,}   items {self.items:,}   tokens {self.tokens:,}",
            f"  document length: min {self.min_length:,}  mean {self.mean_length:,.1f}  "
            f"median {self.median_length:,.0f}  max {self.max_length:,}",
            "  length histogram (tokens per document):",
        ]
        peak = max((n for _, _, n in self.histogram), default=1) or 1
        for lo, hi, n in self.histogram:
            bar = "#" * max(1 if n else 0, round(40 * n / peak))
            lines.append(f"  {lo:>10,} - {hi - 1:<10,} {n:>10,} {bar}")
        return "\n".join(lines)


def dataset_stats(prefix: str | Path) -> DatasetStats:
    """Document and token counts and a power-of-two histogram of document lengths."""
    ds = MMapIndexedDataset(prefix)
    item_ends = np.cumsum(ds.sizes, dtype=np.int64)
    # document length = tokens of its items: differences of the cumulative sizes at doc_idx
    ends = np.concatenate([[0], item_ends])[np.asarray(ds.doc_idx, dtype=np.int64)]
    lengths = np.diff(ends)  # (documents,)
    histogram = []
    if lengths.size:
        buckets = np.where(lengths > 0, np.floor(np.log2(np.maximum(lengths, 1))) + 1, 0)
        counts = np.bincount(buckets.astype(np.int64))
        for b, n in enumerate(counts):
            lo, hi = (0, 1) if b == 0 else (2 ** (b - 1), 2**b)
            if n:
                histogram.append((int(lo), int(hi), int(n)))
    return DatasetStats(
        prefix=str(prefix),
        dtype=ds.dtype.name,
        documents=int(lengths.size),
        items=len(ds),
        tokens=int(lengths.sum()),
        min_length=int(lengths.min()) if lengths.size else 0,
        mean_length=float(lengths.mean()) if lengths.size else 0.0,
        median_length=float(np.median(lengths)) if lengths.size else 0.0,
        max_length=int(lengths.max()) if lengths.size else 0,
        histogram=histogram,
    )
