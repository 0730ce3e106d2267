"""GPT index build time and memory on a synthetic 1B-token, 1M-document dataset, and random
sample read latency.

    python bench/bench_index.py [--dir /tmp/bench_index] [--tokens 1e9] [--docs 1e6]

Writes a uint16 `.bin/.idx` of random tokens (2 GB for 1B tokens) into --dir, then, each in a
fresh subprocess (peak memory = ru_maxrss of that process):

* builds the train index (doc_idx, sample_idx, shuffle_idx; seq_length 2048, one and three
  epochs of samples) with the compiled helper and with the numpy fallback: the whole build
  (hash, shuffles, sample index, atomic .npy writes), the sample-index step alone, and memory
  (resident before the build and peak; torch is imported first, as in training);
* reads random samples through GPTDataset (page cache warm, as the file was just written).

Prints a table and writes bench/results/data_index.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from megatron.data.gpt_dataset import GPTDataset  # noqa: E402
from megatron.data.index_helpers import index_helpers  # noqa: E402
from megatron.data.indexed_dataset import MMapIndexedDataset  # noqa: E402
from megatron.data.indexed_writer import IndexedDatasetWriter  # noqa: E402

SEQ_LENGTH = 2048


def make_dataset(prefix: Path, tokens: int, docs: int, seed: int = 0) -> None:
    """Random documents (lengths uniform around tokens/docs) totalling about `tokens`."""
    rng = np.random.default_rng(seed)
    mean = tokens // docs
    sizes = rng.integers(1, 2 * mean, size=docs).astype(np.int64)
    per_call = 1 << 16  # documents per write
    with IndexedDatasetWriter(prefix, np.uint16) as w:
        for start in range(0, docs, per_call):
            chunk = sizes[start : start + per_call]
            w.add_documents(rng.integers(0, 50257, size=int(chunk.sum()), dtype=np.uint16), chunk)


def _rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure_build(prefix: Path, epochs: int, cache: Path) -> dict:
    import torch.distributed  # noqa: F401 - loaded in training anyway; keep it out of the timing

    ds = MMapIndexedDataset(prefix)
    samples = (epochs * ds.num_tokens - 1) // SEQ_LENGTH
    rss_before = _rss_mb()
    t0 = time.perf_counter()
    gpt = GPTDataset("train", ds, np.arange(len(ds), dtype=np.int32), samples, SEQ_LENGTH, 1234,
                     cache_prefix=cache / "bench")  # fmt: skip
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    doc_idx = np.asarray(gpt.doc_idx)
    t0 = time.perf_counter()
    index_helpers().build_sample_idx(ds.sizes, doc_idx, SEQ_LENGTH, len(gpt))
    helper_s = time.perf_counter() - t0
    return dict(helpers=index_helpers().name, epochs=gpt.num_epochs, samples=len(gpt),
                build_s=seconds, sample_idx_s=helper_s, rss_before_mb=rss_before,
                peak_rss_mb=peak)  # fmt: skip


def measure_reads(prefix: Path, cache: Path, reads: int = 20000) -> dict:
    ds = MMapIndexedDataset(prefix)
    samples = (ds.num_tokens - 1) // SEQ_LENGTH
    gpt = GPTDataset("train", ds, np.arange(len(ds), dtype=np.int32), samples, SEQ_LENGTH, 1234,
                     cache_prefix=cache / "bench")  # fmt: skip
    rng = np.random.default_rng(1)
    order = rng.integers(0, len(gpt), size=reads)
    times = np.empty(reads)
    for k, i in enumerate(order):
        t0 = time.perf_counter()
        gpt[int(i)]
        times[k] = time.perf_counter() - t0
    us = times * 1e6
    return dict(reads=reads, mean_us=float(us.mean()), p50_us=float(np.percentile(us, 50)),
                p99_us=float(np.percentile(us, 99)), max_us=float(us.max()))  # fmt: skip


def _sub(args: list[str], env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True,
                         text=True, env={**os.environ, **(env or {})}).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", default="/tmp/bench_index")
    p.add_argument("--tokens", type=float, default=1e9)
    p.add_argument("--docs", type=float, default=1e6)
    p.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "data_index.json"))
    args = p.parse_args()
    root = Path(args.dir)
    prefix = root / "synthetic"
    if args.measure:
        what, epochs, cache = args.measure
        if what == "build":
            print(json.dumps(measure_build(prefix, int(epochs), Path(cache))))
        else:
            print(json.dumps(measure_reads(prefix, Path(cache))))
        return
    root.mkdir(parents=True, exist_ok=True)
    ds_ok = (root / "synthetic.idx").exists()
    if not ds_ok or MMapIndexedDataset(prefix).num_docs != int(args.docs):
        t0 = time.perf_counter()
        make_dataset(prefix, int(args.tokens), int(args.docs))
        print(f"wrote {prefix}.bin/.idx in {time.perf_counter() - t0:.1f} s")
    ds = MMapIndexedDataset(prefix)
    builds = []
    for helpers in ("compiled", "numpy"):
        for epochs in (1, 3):
            cache = root / f"cache_{helpers}_{epochs}"
            shutil.rmtree(cache, ignore_errors=True)
            env = {"MEGATRON_DATA_HELPERS": helpers}
            builds.append(_sub(["--measure", "build", str(epochs), str(cache)], env))
    reads = _sub(["--measure", "read", "1", str(root / "cache_compiled_1")])
    print(f"dataset: {ds.num_docs:,} documents, {ds.num_tokens:,} tokens, seq_length {SEQ_LENGTH}")
    print(f"{'helpers':<10}{'epochs':>7}{'samples':>12}{'build s':>9}{'sample_idx s':>14}"
          f"{'RSS before MB':>15}{'peak RSS MB':>13}")  # fmt: skip
    for b in builds:
        print(f"{b['helpers']:<10}{b['epochs']:>7}{b['samples']:>12,}{b['build_s']:>9.2f}"
              f"{b['sample_idx_s']:>14.3f}{b['rss_before_mb']:>15.0f}"
              f"{b['peak_rss_mb']:>13.0f}")  # fmt: skip
    print(f"random sample reads ({reads['reads']:,}): mean {reads['mean_us']:.1f} us, "
          f"p50 {reads['p50_us']:.1f} us, p99 {reads['p99_us']:.1f} us")  # fmt: skip
    result = dict(documents=ds.num_docs, tokens=ds.num_tokens, seq_length=SEQ_LENGTH,
                  builds=builds, reads=reads, cpu_count=os.cpu_count(),
                  load_average=os.getloadavg())  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
