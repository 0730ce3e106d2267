"""The post-training preprocessing run: jsonl records -> aligned `.bin/.idx` datasets.

    summary = preprocess_post_training(PostTrainingOptions(
        inputs=["prefs.jsonl"], output_prefix="data/prefs", data_format="pairs",
        tokenizer_type="HFTokenizer", vocab_file="tokenizer.json", seq_length=2048))

writes one dataset per output of the format (post_formats.py), e.g. for `pairs`
`data/prefs_text_pos_document`, `..._text_neg_document`, `..._text_pos_label_document`,
`..._text_neg_label_document`. Document i of every output comes from the same record: a record
that fails anywhere (a missing field, a pair that does not align, one side too long) is dropped
from all of them and counted in the problem report, never written to some and not others.

Input reading, worker processes, progress and the problem report are preprocess_data.py's.
Every output is written under temporary names; at the end the first output's old `.idx` is
removed, the others are finalized, and the first one last: whenever `{prefix}_text(_pos)_document`
looks whole, every companion dataset of the same run is whole too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from megatron.data.indexed_format import best_fitting_dtype, index_path
from megatron.data.indexed_writer import IndexedDatasetWriter
from megatron.data.preprocess.chat_template import TemplateNotIncremental, load_chat_template
from megatron.data.preprocess.encoder import (
    MALFORMED_JSON,
    NOT_UTF8,
    ChunkResult,
    PreprocessError,
    TokenizerSpec,
    _loads,
)
from megatron.data.preprocess.inputs import iter_chunks, resolve_inputs
from megatron.data.preprocess.pipeline import PreprocessSummary, ordered_map
from megatron.data.preprocess.post_formats import (
    POST_TRAINING_FORMATS,
    TEMPLATE_NOT_INCREMENTAL,
    TEMPLATE_REFUSED,
    RecordProblem,
    SequenceBuilder,
)
from megatron.data.preprocess.report import ProblemLog, Progress

LABEL_SCOPES = ("completion", "eod")
# dtype of each output kind: labels hold -100, so they are signed; rewards are floats.
_KIND_DTYPES = {"labels": np.int32, "reward": np.float32}

try:
    from jinja2.exceptions import TemplateError as _TemplateError
except ImportError:  # no jinja2: only the built-in ChatML template renders, and never raises
    _TemplateError = RecordProblem


@dataclass(frozen=True)
class PostTrainingOptions:
    inputs: list[str]
    output_prefix: str
    data_format: str
    tokenizer_type: str
    vocab_file: str | None = None
    merge_file: str | None = None
    chat_template: str | None = None
    seq_length: int | None = None
    label_scope: str = "completion"
    workers: int = 1
    log_interval: int = 10_000
    strict: bool = False
    chunk_bytes: int = 1 << 20


@dataclass(frozen=True)
class RecordEncodeOptions:
    """What a worker needs to rebuild the encoder (tokenizers are not shipped pickled)."""

    tokenizer: TokenizerSpec
    data_format: str
    chat_template: str | None
    seq_length: int | None
    label_scope: str
    strict: bool


class RecordEncoder:
    """Encodes chunks of jsonl records with one format; a bad record yields nothing at all."""

    def __init__(self, options: RecordEncodeOptions, tokenizer=None):
        self.options = options
        self.format = POST_TRAINING_FORMATS[options.data_format]
        tokenizer = tokenizer if tokenizer is not None else options.tokenizer.build()
        template = load_chat_template(options.chat_template, options.tokenizer.vocab_file)
        self.build = SequenceBuilder(tokenizer, template, options.seq_length, options.label_scope)

    def _record(self, raw: bytes) -> dict:
        try:
            record = _loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise RecordProblem(NOT_UTF8) from None
        except ValueError:
            raise RecordProblem(MALFORMED_JSON) from None
        if not isinstance(record, dict):
            raise RecordProblem(MALFORMED_JSON)
        return self.format.encode(record, self.build)

    def encode(self, chunk) -> ChunkResult:
        docs: dict[str, list] = {name: [] for name in self.format.outputs}
        problems = []
        for line, raw in chunk.records:
            try:
                encoded = self._record(raw)
            except RecordProblem as e:
                kind = e.kind
            except TemplateNotIncremental:
                kind = TEMPLATE_NOT_INCREMENTAL
            except _TemplateError:
                kind = TEMPLATE_REFUSED
            else:
                for name, values in encoded.items():
                    docs[name].append(values)
                continue
            if self.options.strict:
                raise PreprocessError(f"{chunk.source}:{line}: {kind} (--strict)")
            problems.append((kind, chunk.source, line))
        tokens, sizes = {}, {}
        for name, values in docs.items():
            sizes[name] = np.asarray([len(v) for v in values], dtype=np.int64)
            flat = [x for v in values for x in v]
            kind = self.format.outputs[name]
            tokens[name] = np.asarray(flat, dtype=np.float64 if kind == "reward" else np.int64)
        data_bytes = sum(len(raw) for _, raw in chunk.records)
        return ChunkResult(tokens, sizes, len(chunk.records), data_bytes, chunk.raw_bytes, problems)


def _validate(opts: PostTrainingOptions) -> None:
    if opts.data_format not in POST_TRAINING_FORMATS:
        raise PreprocessError(
            f"--format {opts.data_format!r}: valid: {', '.join(POST_TRAINING_FORMATS)}"
        )
    if opts.label_scope not in LABEL_SCOPES:
        valid = ", ".join(LABEL_SCOPES)
        raise PreprocessError(f"--label-scope {opts.label_scope!r}: valid: {valid}")
    if opts.seq_length is not None and opts.seq_length < 1:
        raise PreprocessError(f"--seq-length must be >= 1, got {opts.seq_length}")
    if opts.workers < 1:
        raise PreprocessError(f"--workers must be >= 1, got {opts.workers}")


def _finish(writers: dict[str, IndexedDatasetWriter]) -> None:
    """Finalize companions first and the first output last (see the module docstring)."""
    first, *rest = writers
    index_path(writers[first].prefix).unlink(missing_ok=True)
    for name in reversed(rest):
        writers[name].finalize()
    writers[first].finalize()


def preprocess_post_training(opts: PostTrainingOptions, log=None) -> PreprocessSummary:
    """Tokenize `opts.inputs` into the aligned datasets of `opts.data_format`.

    Raises PreprocessError for unusable arguments or inputs, when no record is usable, and
    (with `strict`) at the first bad record; the outputs are then left untouched.
    """
    log = log if log is not None else sys.stderr
    _validate(opts)
    files = resolve_inputs(opts.inputs)
    if any(f.kind == "text" for f in files):
        raise PreprocessError("post-training inputs are jsonl records; plain text files hold none")
    spec = TokenizerSpec(opts.tokenizer_type, opts.vocab_file, opts.merge_file)
    tokenizer = spec.build()
    fmt = POST_TRAINING_FORMATS[opts.data_format]
    options = RecordEncodeOptions(spec, opts.data_format, opts.chat_template, opts.seq_length,
                                  opts.label_scope, opts.strict)  # fmt: skip
    token_dtype = best_fitting_dtype(tokenizer.vocab_size)
    outputs = {name: f"{opts.output_prefix}_{name}_document" for name in fmt.outputs}
    writers = {
        name: IndexedDatasetWriter(outputs[name], _KIND_DTYPES.get(kind, token_dtype))
        for name, kind in fmt.outputs.items()
    }
    problems = ProblemLog()
    progress = Progress(sum(f.size for f in files), opts.log_interval, log)
    token_outputs = [name for name, kind in fmt.outputs.items() if kind == "tokens"]
    summary = PreprocessSummary(outputs, dict.fromkeys(outputs, 0), dict.fromkeys(token_outputs, 0))
    try:
        chunks = iter_chunks(files, opts.chunk_bytes)
        for result in ordered_map(options, chunks, opts.workers, tokenizer, RecordEncoder):
            for name, writer in writers.items():
                writer.add_documents(result.tokens[name], result.sizes[name])
                summary.documents[name] += len(result.sizes[name])
            new_tokens = sum(len(result.tokens[name]) for name in token_outputs)
            for name in token_outputs:
                summary.tokens[name] += len(result.tokens[name])
            problems.add(result.problems)
            summary.records += result.records
            summary.data_bytes += result.data_bytes
            progress.update(result.records, result.raw_bytes, result.data_bytes, new_tokens)
        if not summary.documents[next(iter(outputs))]:
            problems.report(log)
            raise PreprocessError(
                f"--input {', '.join(map(str, opts.inputs))}: no usable {fmt.name} record "
                f"(format: {', '.join(fmt.outputs)}); see the problems above"
            )
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    _finish(writers)
    summary.seconds = progress.elapsed
    summary.problems = problems.counts
    summary.problem_examples = problems.examples
    progress.final(summary)
    problems.report(log)
    return summary
