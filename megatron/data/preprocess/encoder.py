"""Turning chunks of raw records into token arrays, counting (not failing on) bad input.

Runs in the worker processes: decode UTF-8, parse JSON, pick the keys, tokenize in a batch,
append EOD, and return one flat token array plus sizes per key.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field

import numpy as np

try:  # ~3x faster JSON parsing where available; identical results
    import orjson as _fast_json
except ImportError:
    _fast_json = None

# Problem kinds, reported with counts and the first few locations.
MALFORMED_JSON = "malformed JSON line"
NOT_UTF8 = "non-UTF-8 bytes"
EMPTY_DOC = "empty document"
UNTOKENIZABLE = "text the tokenizer rejected"


def missing_key(key: str) -> str:
    return f"missing key {key!r}"


def not_a_string(key: str) -> str:
    return f"key {key!r} is not a string"


class PreprocessError(ValueError):
    """Bad input or arguments for preprocessing; the message names the file and the problem."""


@dataclass(frozen=True)
class TokenizerSpec:
    """How to rebuild the tokenizer in a worker process (tokenizers are not shipped pickled)."""

    tokenizer_type: str
    vocab_file: str | None = None
    merge_file: str | None = None

    def build(self):
        from megatron.data.tokenizers import make_tokenizer

        return make_tokenizer(self.tokenizer_type, self.vocab_file, self.merge_file)


@dataclass(frozen=True)
class EncodeOptions:
    tokenizer: TokenizerSpec
    keys: tuple[str, ...]
    dtype: str
    append_eod: bool
    strict: bool = False


@dataclass
class ChunkResult:
    tokens: dict[str, np.ndarray]
    sizes: dict[str, np.ndarray]
    records: int
    data_bytes: int  # decompressed input bytes
    raw_bytes: int
    problems: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, file, line)


def _loads(text: str):
    """json.loads; orjson first for speed, the standard parser when orjson refuses (it is
    stricter, e.g. on lone surrogate escapes), so results never depend on orjson."""
    if _fast_json is not None:
        try:
            return _fast_json.loads(text)
        except ValueError:
            pass
    return json.loads(text)


class DocumentEncoder:
    """Encodes chunks with one tokenizer; `append_eod` is dropped when the tokenizer already
    ends every text with EOD (never two separators)."""

    def __init__(self, options: EncodeOptions, tokenizer=None):
        # One core per worker: --workers sets the parallelism, not the tokenizer's threads.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.options = options
        self.tokenizer = tokenizer if tokenizer is not None else options.tokenizer.build()
        self.dtype = np.dtype(options.dtype)
        self.eod = self.tokenizer.eod
        self.append_eod = options.append_eod and not self.tokenizer.adds_eod

    def _problem(self, problems, kind: str, source: str, line: int) -> None:
        if self.options.strict:
            raise PreprocessError(f"{source}:{line}: {kind} (--strict)")
        problems.append((kind, source, line))

    def _texts(self, chunk, problems) -> dict[str, list[tuple[int, str]]]:
        """Per key, the (line, text) pairs that are usable documents."""
        keys = self.options.keys
        texts: dict[str, list[tuple[int, str]]] = {k: [] for k in keys}
        for line, raw in chunk.records:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                self._problem(problems, NOT_UTF8, chunk.source, line)
                continue
            if chunk.kind == "text":
                docs = {keys[0]: text}
            else:
                try:
                    docs = _loads(text)
                except ValueError:
                    docs = None
                if not isinstance(docs, dict):
                    self._problem(problems, MALFORMED_JSON, chunk.source, line)
                    continue
            for key in keys:
                value = docs.get(key)
                if value is None:
                    self._problem(problems, missing_key(key), chunk.source, line)
                elif not isinstance(value, str):
                    self._problem(problems, not_a_string(key), chunk.source, line)
                elif not value:
                    self._problem(problems, EMPTY_DOC, chunk.source, line)
                else:
                    texts[key].append((line, value))
        return texts

    def _tokenize(self, docs, source: str, problems) -> list[list[int]]:
        try:
            return self.tokenizer.tokenize_batch([t for _, t in docs])
        except Exception:  # e.g. lone surrogates from a JSON escape: find the culprits one by one
            out = []
            for line, text in docs:
                try:
                    out.append(self.tokenizer.tokenize(text))
                except Exception:
                    self._problem(problems, UNTOKENIZABLE, source, line)
                    out.append(None)
            return out

    def encode(self, chunk) -> ChunkResult:
        problems: list[tuple[str, str, int]] = []
        texts = self._texts(chunk, problems)
        tokens, sizes = {}, {}
        for key, docs in texts.items():
            ids = self._tokenize(docs, chunk.source, problems) if docs else []
            for (line, _), doc in zip(docs, ids):
                if doc == []:  # e.g. only characters the tokenizer normalises away
                    self._problem(problems, EMPTY_DOC, chunk.source, line)
            ids = [doc for doc in ids if doc]
            if self.append_eod:
                for doc in ids:
                    doc.append(self.eod)
            lengths = [len(doc) for doc in ids]
            flat = itertools.chain.from_iterable(ids)
            tokens[key] = np.fromiter(flat, dtype=self.dtype, count=sum(lengths))
            sizes[key] = np.asarray(lengths, dtype=np.int32)
        data_bytes = sum(len(raw) for _, raw in chunk.records)
        return ChunkResult(tokens, sizes, len(chunk.records), data_bytes, chunk.raw_bytes, problems)


_WORKER_ENCODER = None


def init_worker(options, make_encoder=DocumentEncoder) -> None:
    """Pool initializer: the worker's own encoder (`make_encoder(options)`: DocumentEncoder,
    or post-training's RecordEncoder)."""
    global _WORKER_ENCODER
    _WORKER_ENCODER = make_encoder(options)


def encode_in_worker(chunk) -> ChunkResult:
    return _WORKER_ENCODER.encode(chunk)
