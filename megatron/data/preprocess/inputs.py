"""Input discovery and streaming: jsonl, jsonl.gz, jsonl.zst and plain text, files or folders.

Documents are read lazily in chunks of about `chunk_bytes`, so memory does not grow with the
corpus. A jsonl line is one document; a plain text file is one document. Every record keeps its
file and line number for problem reports.
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from megatron.data.preprocess.encoder import PreprocessError

# suffix -> (record kind, compression)
SUFFIXES = {
    ".jsonl": ("jsonl", None),
    ".json": ("jsonl", None),
    ".jsonl.gz": ("jsonl", "gz"),
    ".json.gz": ("jsonl", "gz"),
    ".jsonl.zst": ("jsonl", "zst"),
    ".json.zst": ("jsonl", "zst"),
    ".txt": ("text", None),
    ".txt.gz": ("text", "gz"),
    ".txt.zst": ("text", "zst"),
}


@dataclass(frozen=True)
class InputFile:
    path: Path
    kind: str  # "jsonl" or "text"
    compression: str | None

    @property
    def size(self) -> int:
        return self.path.stat().st_size


@dataclass
class Chunk:
    """Raw documents of one file: (line number, bytes) records, decoded by the workers."""

    source: str
    kind: str
    records: list[tuple[int, bytes]]
    raw_bytes: int  # bytes of the (possibly compressed) file consumed for this chunk


def _classify(path: Path) -> InputFile | None:
    name = path.name.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return InputFile(path, *SUFFIXES[suffix])
    return None


def resolve_inputs(inputs: list[str]) -> list[InputFile]:
    """Files to read, in order: each entry (comma-separated lists allowed) is a file or a folder
    searched recursively (sorted) for the supported suffixes. Raises PreprocessError for a
    missing or unreadable input or an unsupported suffix."""
    files: list[InputFile] = []
    for entry in (p for item in inputs for p in str(item).split(",") if p):
        path = Path(entry)
        if path.is_dir():
            found = [f for f in sorted(path.rglob("*")) if f.is_file() and _classify(f)]
            if not found:
                valid = ", ".join(SUFFIXES)
                raise PreprocessError(f"--input {path}: folder holds no files ending in {valid}")
            files += [_classify(f) for f in found]
            continue
        if not path.exists():
            raise PreprocessError(f"--input {path}: no such file or folder")
        spec = _classify(path)
        if spec is None:
            raise PreprocessError(
                f"--input {path}: unsupported file type; valid: {', '.join(SUFFIXES)}"
            )
        files.append(spec)
    for spec in files:
        if not os.access(spec.path, os.R_OK):
            raise PreprocessError(f"--input {spec.path}: file is not readable (permissions)")
    return files


class _CountingReader(io.RawIOBase):
    """Wraps a binary file and counts the bytes read from it (progress through compressed
    inputs)."""

    def __init__(self, raw):
        self._raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._raw.readinto(buffer)
        self.count += n or 0
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def _open_stream(spec: InputFile):
    """(binary stream of decompressed bytes, counting reader of the file itself)."""
    try:
        raw = open(spec.path, "rb")
    except OSError as e:
        raise PreprocessError(f"--input {spec.path}: cannot open ({e.strerror})") from None
    counter = _CountingReader(raw)
    if spec.compression == "gz":
        return gzip.GzipFile(fileobj=counter, mode="rb"), counter
    if spec.compression == "zst":
        try:
            import zstandard
        except ImportError:
            raise PreprocessError(
                f"--input {spec.path}: reading .zst needs the `zstandard` package"
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(counter, read_across_frames=True)
        return io.BufferedReader(reader, 1 << 20), counter
    return io.BufferedReader(counter, 1 << 20), counter


def iter_chunks(files: list[InputFile], chunk_bytes: int = 1 << 20) -> Iterator[Chunk]:
    """Chunks of raw records from `files`, never spanning two files."""
    for spec in files:
        stream, counter = _open_stream(spec)
        source = str(spec.path)
        try:
            if spec.kind == "text":
                data = stream.read()
                yield Chunk(source, "text", [(1, data)], counter.count)
                continue
            records, size, reported = [], 0, 0
            try:
                for line_no, line in enumerate(stream, start=1):
                    records.append((line_no, line))
                    size += len(line)
                    if size >= chunk_bytes:
                        yield Chunk(source, "jsonl", records, counter.count - reported)
                        reported = counter.count
                        records, size = [], 0
            except Exception as e:  # a corrupt gzip/zstd stream raises its library's error
                if spec.compression is None:
                    raise
                raise PreprocessError(f"{source}: cannot decompress ({e})") from None
            if records or counter.count > reported:
                yield Chunk(source, "jsonl", records, counter.count - reported)
        finally:
            stream.close()
