"""The preprocessing run: inputs -> worker processes -> ordered writes -> `.bin/.idx`.

    summary = preprocess(PreprocessOptions(inputs=["corpus.jsonl"], output_prefix="data/c",
                                           tokenizer_type="GPT2BPETokenizer", vocab_file=...,
                                           merge_file=..., append_eod=True, workers=2))

Writes `{output_prefix}_{key}_document.bin/.idx` per jsonl key. At most `2 * workers` chunks
are in flight, so memory is bounded whatever the corpus size; results are written in input
order, so the output does not depend on the number of workers.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field

from megatron.data.indexed_format import best_fitting_dtype
from megatron.data.indexed_writer import IndexedDatasetWriter
from megatron.data.preprocess.encoder import (
    DocumentEncoder,
    EncodeOptions,
    PreprocessError,
    TokenizerSpec,
    encode_in_worker,
    init_worker,
)
from megatron.data.preprocess.inputs import iter_chunks, resolve_inputs
from megatron.data.preprocess.report import ProblemLog, Progress


@dataclass(frozen=True)
class PreprocessOptions:
    inputs: list[str]
    output_prefix: str
    tokenizer_type: str
    vocab_file: str | None = None
    merge_file: str | None = None
    jsonl_keys: tuple[str, ...] = ("text",)
    append_eod: bool = False
    workers: int = 1
    log_interval: int = 10_000
    strict: bool = False
    chunk_bytes: int = 1 << 20


@dataclass
class PreprocessSummary:
    outputs: dict[str, str]  # key -> output prefix (without .bin/.idx)
    documents: dict[str, int]  # key -> documents written
    tokens: dict[str, int]
    records: int = 0
    data_bytes: int = 0
    seconds: float = 0.0
    problems: dict[str, int] = field(default_factory=dict)
    problem_examples: dict[str, list[str]] = field(default_factory=dict)
    eod_already_added: bool = False

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())


def ordered_map(options, chunks, workers: int, tokenizer, make_encoder=DocumentEncoder):
    """Chunks encoded by `make_encoder(options, tokenizer)` in input order, in-process for one
    worker (reusing `tokenizer`), else over a process pool whose workers build their own."""
    if workers <= 1:
        encoder = make_encoder(options, tokenizer)
        for chunk in chunks:
            yield encoder.encode(chunk)
        return
    # spawn: the parent may hold tokenizer threads, which fork would copy mid-state.
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers, initializer=init_worker, initargs=(options, make_encoder)) as pool:
        pending = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(encode_in_worker, (chunk,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def preprocess(opts: PreprocessOptions, log=None) -> PreprocessSummary:
    """Tokenize `opts.inputs` into indexed datasets; returns counts and problems.

    Raises PreprocessError for unusable arguments or inputs (and, with `strict`, for the first
    bad record); the outputs are then left untouched.
    """
    log = log if log is not None else sys.stderr
    if opts.workers < 1:
        raise PreprocessError(f"--workers must be >= 1, got {opts.workers}")
    keys = tuple(opts.jsonl_keys)
    if not keys or len(set(keys)) != len(keys):
        raise PreprocessError(f"--jsonl-keys must be distinct and non-empty, got {list(keys)}")
    files = resolve_inputs(opts.inputs)
    if len(keys) > 1 and any(f.kind == "text" for f in files):
        raise PreprocessError("plain text inputs are single documents: give one --jsonl-keys key")
    spec = TokenizerSpec(opts.tokenizer_type, opts.vocab_file, opts.merge_file)
    tokenizer = spec.build()
    dtype = best_fitting_dtype(tokenizer.vocab_size)
    eod_already = opts.append_eod and tokenizer.adds_eod
    if eod_already:
        print(
            f"note: {tokenizer.name} already ends every document with EOD (id {tokenizer.eod}); "
            "--append-eod will not add a second one",
            file=log,
        )
    options = EncodeOptions(spec, keys, dtype.__name__, opts.append_eod, opts.strict)
    outputs = {k: f"{opts.output_prefix}_{k}_document" for k in keys}
    problems = ProblemLog()
    progress = Progress(sum(f.size for f in files), opts.log_interval, log)
    summary = PreprocessSummary(outputs, dict.fromkeys(keys, 0), dict.fromkeys(keys, 0))
    with ExitStack() as stack:
        writers = {
            k: stack.enter_context(IndexedDatasetWriter(p, dtype)) for k, p in outputs.items()
        }
        chunks = iter_chunks(files, opts.chunk_bytes)
        for result in ordered_map(options, chunks, opts.workers, tokenizer):
            for key, writer in writers.items():
                writer.add_documents(result.tokens[key], result.sizes[key])
                summary.documents[key] += len(result.sizes[key])
                summary.tokens[key] += len(result.tokens[key])
            problems.add(result.problems)
            summary.records += result.records
            summary.data_bytes += result.data_bytes
            progress.update(result.records, result.raw_bytes, result.data_bytes,
                            sum(len(t) for t in result.tokens.values()))  # fmt: skip
    summary.seconds = progress.elapsed
    summary.problems = problems.counts
    summary.problem_examples = problems.examples
    summary.eod_already_added = eod_already
    progress.final(summary)
    problems.report(log)
    return summary


__all__ = ["PreprocessError", "PreprocessOptions", "PreprocessSummary", "preprocess"]
