"""Preprocessing: round trips for every tokenizer, input formats, workers, bad input."""

from __future__ import annotations

import gzip
import io
import json

import numpy as np
import pytest

from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.preprocess import PreprocessError, PreprocessOptions, preprocess
from megatron.data.tokenizers import make_tokenizer
from tests.unit.data.conftest import HF_TOKENIZER, SPM_MODEL

UNICODE_DOC = "Ünïcödé — 日本語のテキスト, emoji 🎭, tabs\tand  double  spaces\n"


def _tokenizer_args(name, gpt2_files=None):
    if name == "GPT2BPETokenizer":
        return dict(vocab_file=gpt2_files[0], merge_file=gpt2_files[1])
    return {
        "HFTokenizer": dict(vocab_file=str(HF_TOKENIZER)),
        "SPMTokenizer": dict(vocab_file=str(SPM_MODEL)),
        "CharLevelTokenizer": {},
    }[name]


def _write_jsonl(path, docs, key="text"):
    path.write_text("".join(json.dumps({key: d}) + "\n" for d in docs), encoding="utf-8")


def _run(tmp_path, inputs, name="HFTokenizer", gpt2_files=None, **kw):
    args = _tokenizer_args(name, gpt2_files)
    opts = PreprocessOptions(
        inputs=[str(p) for p in inputs], output_prefix=str(tmp_path / "out"),
        tokenizer_type=name, **args, **kw,
    )  # fmt: skip
    return preprocess(opts, log=io.StringIO())


@pytest.mark.parametrize(
    "name", ["GPT2BPETokenizer", "HFTokenizer", "SPMTokenizer", "CharLevelTokenizer"]
)
def test_round_trip_every_tokenizer(tmp_path, sample_paragraphs, gpt2_files, name):
    docs = sample_paragraphs[:120] + [UNICODE_DOC]
    _write_jsonl(tmp_path / "in.jsonl", docs)
    summary = _run(tmp_path, [tmp_path / "in.jsonl"], name, gpt2_files, append_eod=True)
    tok = make_tokenizer(name, **_tokenizer_args(name, gpt2_files))
    ds = MMapIndexedDataset(summary.outputs["text"])
    assert ds.dtype == (np.uint16 if tok.vocab_size < 65500 else np.int32)
    assert ds.num_docs == len(docs) == summary.documents["text"]
    for i, doc in enumerate(docs):
        ids = ds[i]
        assert ids[-1] == tok.eod and tok.eod not in ids[:-1].tolist()
        assert tok.detokenize(ids[:-1]) == doc
    assert summary.tokens["text"] == ds.num_tokens and not summary.problems


def test_input_formats_give_identical_datasets(tmp_path, sample_paragraphs):
    docs = sample_paragraphs[:40]
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    (tmp_path / "a.jsonl").write_bytes(lines)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(lines))
    zstd = pytest.importorskip("zstandard")
    (tmp_path / "c.jsonl.zst").write_bytes(zstd.ZstdCompressor().compress(lines))
    folder = tmp_path / "texts"
    folder.mkdir()
    for i, d in enumerate(docs):  # a plain text file is one document
        (folder / f"{i:03d}.txt").write_text(d, encoding="utf-8")
    outputs = []
    for source in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "texts"):
        out = tmp_path / source.split(".")[0]
        out.mkdir(exist_ok=True)
        summary = _run(out, [tmp_path / source], append_eod=True)
        outputs.append(
            [open(f"{summary.outputs['text']}{ext}", "rb").read() for ext in (".bin", ".idx")]
        )
    assert all(o == outputs[0] for o in outputs)


def test_two_workers_match_one_and_several_inputs(tmp_path, sample_paragraphs):
    _write_jsonl(tmp_path / "a.jsonl", sample_paragraphs[:150])
    _write_jsonl(tmp_path / "b.jsonl", sample_paragraphs[150:])
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    inputs = [f"{tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}"]  # comma lists work too
    s1 = _run(tmp_path / "one", inputs, append_eod=True, chunk_bytes=2000)
    s2 = _run(tmp_path / "two", inputs, append_eod=True, chunk_bytes=2000, workers=2)
    assert s1.documents == s2.documents == {"text": len(sample_paragraphs)}
    for ext in (".bin", ".idx"):
        a = open(s1.outputs["text"] + ext, "rb").read()
        assert a == open(s2.outputs["text"] + ext, "rb").read()


def test_several_keys_several_datasets(tmp_path):
    rows = [{"q": f"question {i}", "a": f"answer {i}"} for i in range(10)]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = _run(tmp_path, [tmp_path / "qa.jsonl"], name="CharLevelTokenizer",
                   jsonl_keys=("q", "a"))  # fmt: skip
    assert set(summary.outputs) == {"q", "a"}
    assert summary.outputs["a"].endswith("out_a_document")
    a = MMapIndexedDataset(summary.outputs["a"])
    assert bytes(a[3].tolist()).decode() == "answer 3"


def test_bad_records_counted_with_locations(tmp_path):
    good = json.dumps({"text": "fine"}).encode()
    lines = [
        good,  # 1
        b"{not json",  # 2
        json.dumps({"other": "x"}).encode(),  # 3
        json.dumps({"text": ""}).encode(),  # 4
        b'{"text": "caf\xe9"}',  # 5: latin-1 byte, not UTF-8
        json.dumps({"text": 7}).encode(),  # 6
        good,  # 7
        b"[1, 2]",  # 8: JSON but not an object
        json.dumps({"text": "\ud800 lone surrogate"}).encode(),  # 9
        b"",  # 10: blank line
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    log = io.StringIO()
    opts = PreprocessOptions(
        [str(path)], str(tmp_path / "out"), "HFTokenizer", vocab_file=str(HF_TOKENIZER)
    )
    summary = preprocess(opts, log=log)
    assert summary.documents["text"] == 2 and summary.records == 10
    assert summary.problems == {
        "malformed JSON line": 3,
        "missing key 'text'": 1,
        "empty document": 1,
        "non-UTF-8 bytes": 1,
        "key 'text' is not a string": 1,
        "text the tokenizer rejected": 1,
    }
    assert summary.problem_examples["malformed JSON line"] == [
        f"{path}:2", f"{path}:8", f"{path}:10"]  # fmt: skip
    assert summary.problem_examples["non-UTF-8 bytes"] == [f"{path}:5"]
    report = log.getvalue()
    assert "skipped 8 bad records" in report and f"first at {path}:3" in report


def test_strict_stops_and_leaves_no_output(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "ok"}\n{"text": ""}\n')
    with pytest.raises(PreprocessError, match=r"in\.jsonl:2: empty document \(--strict\)"):
        _run(tmp_path, [tmp_path / "in.jsonl"], strict=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_unusable_inputs_are_clear_errors(tmp_path):
    with pytest.raises(PreprocessError, match="missing.jsonl: no such file"):
        _run(tmp_path, [tmp_path / "missing.jsonl"])
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(PreprocessError, match="data.csv: unsupported file type; valid: .jsonl"):
        _run(tmp_path, [tmp_path / "data.csv"])
    (tmp_path / "broken.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(PreprocessError, match="broken.jsonl.gz: cannot decompress"):
        _run(tmp_path, [tmp_path / "broken.jsonl.gz"])
    assert not list(tmp_path.glob("out*"))


def test_append_eod_never_doubles(tmp_path):
    from tokenizers import Tokenizer, processors

    backend = Tokenizer.from_file(str(HF_TOKENIZER))
    backend.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 0)]
    )
    backend.save(str(tmp_path / "eos.json"))
    _write_jsonl(tmp_path / "in.jsonl", ["one doc", "another doc"])
    log = io.StringIO()
    opts = PreprocessOptions(inputs=[str(tmp_path / "in.jsonl")], output_prefix=str(tmp_path / "o"),
                             tokenizer_type="HFTokenizer", vocab_file=str(tmp_path / "eos.json"),
                             append_eod=True)  # fmt: skip
    summary = preprocess(opts, log=log)
    assert summary.eod_already_added
    assert log.getvalue().count("will not add a second") == 1
    ds = MMapIndexedDataset(summary.outputs["text"])
    for i in range(2):
        assert ds[i].tolist().count(0) == 1 and ds[i][-1] == 0


def test_cli_progress_and_exit_codes(tmp_path, sample_paragraphs, capsys):
    from tools.preprocess_data import main

    _write_jsonl(tmp_path / "in.jsonl", sample_paragraphs[:30])
    argv = ["--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o"),
            "--tokenizer-type", "HFTokenizer", "--vocab-file", str(HF_TOKENIZER),
            "--append-eod", "--log-interval", "10"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "30 docs |" in err and "tokens/s" in err and "ETA" in err
    argv[argv.index("--vocab-file") + 1] = str(tmp_path / "nope.json")
    assert main(argv) == 1
    assert "vocab_file" in capsys.readouterr().err


def test_killed_run_leaves_no_pair_that_looks_whole(tmp_path):
    """SIGKILL mid-run (input still streaming from a pipe): only temporary names exist."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    fifo = tmp_path / "stream.jsonl"
    os.mkfifo(fifo)
    tool = Path(__file__).resolve().parents[3] / "tools" / "preprocess_data.py"
    proc = subprocess.Popen(
        [sys.executable, str(tool), "--input", str(fifo), "--output-prefix", str(tmp_path / "o"),
         "--tokenizer-type", "CharLevelTokenizer", "--append-eod"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:  # open the pipe once the tool reads it (non-blocking: it may have died)
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "tool did not start"
                time.sleep(0.05)
        os.write(fd, b'{"text": "some streamed document"}\n' * 100)
        while not list(tmp_path.glob("o_text_document.bin.tmp-*")):
            assert proc.poll() is None and time.monotonic() < deadline, "tool did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        os.close(fd)
    finally:
        if proc.poll() is None:
            proc.kill()
    names = [p.name for p in tmp_path.iterdir()]
    assert "o_text_document.bin" not in names and "o_text_document.idx" not in names
    assert any(".tmp-" in n for n in names)
