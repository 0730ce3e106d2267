"""Progress lines and the end-of-run problem report of preprocessing."""

from __future__ import annotations

import time
from collections import Counter


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProblemLog:
    """Counts bad records by kind and keeps the first few locations of each."""

    def __init__(self, examples: int = 5):
        self.max_examples = examples
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}

    def add(self, problems) -> None:
        for kind, source, line in problems:
            self.counts[kind] += 1
            where = self.examples.setdefault(kind, [])
            if len(where) < self.max_examples:
                where.append(f"{source}:{line}")

    def report(self, log) -> None:
        if not self.counts:
            return
        total = sum(self.counts.values())
        print(f"skipped {total} bad records (use --strict to stop at the first):", file=log)
        for kind, n in self.counts.most_common():
            print(f"  {n:>10,}  {kind}; first at {', '.join(self.examples[kind])}", file=log)


class Progress:
    """Prints docs/s, MB/s, tokens/s and (the input size being known) an ETA every
    `interval` documents."""

    def __init__(self, total_raw_bytes: int, interval: int, log):
        self.total = max(total_raw_bytes, 1)
        self.interval = max(interval, 1)
        self.log = log
        self.start = time.perf_counter()
        self.docs = self.raw = self.data = self.tokens = 0
        self._next = self.interval

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def update(self, docs: int, raw_bytes: int, data_bytes: int, tokens: int) -> None:
        self.docs += docs
        self.raw += raw_bytes
        self.data += data_bytes
        self.tokens += tokens
        if self.docs >= self._next:
            self._next = (self.docs // self.interval + 1) * self.interval
            print(self.line(), file=self.log, flush=True)

    def line(self) -> str:
        t = max(self.elapsed, 1e-9)
        text = (
            f"{self.docs:,} docs | {self.docs / t:,.0f} docs/s | {self.data / t / 1e6:.1f} MB/s | "
            f"{self.tokens / t / 1e6:.2f}M tokens/s"
        )
        done = min(self.raw / self.total, 1.0)
        if done > 0:
            text += f" | {100 * done:.1f}% | ETA {_duration(t * (1 - done) / done)}"
        return text

    def final(self, summary) -> None:
        t = max(self.elapsed, 1e-9)
        rate = summary.total_tokens / t / 1e6
        print(
            f"done: {summary.records:,} records, {summary.total_tokens:,} tokens, "
            f"{summary.data_bytes / 1e6:.1f} MB in {t:.1f} s ({rate:.2f}M tokens/s)",
            file=self.log,
        )
        for key, prefix in summary.outputs.items():
            print(f"  {key}: {summary.documents[key]:,} documents -> {prefix}.bin/.idx",
                  file=self.log)  # fmt: skip
