"""generate.py's `sample_output_file`: earlier samples are never overwritten. The pre-flight
refuses a file with samples in it, naming the next free name; the worker's own claim of the
file refuses it too and leaves it as it was; an empty file, a new one and a missing folder are
fine; train.py and precompute runs are not checked. The end-of-run summary names the file and
shows the first sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron.config import ConfigError, config_from_dict
from megatron.inference.text import summary
from megatron.preflight import ERROR, OK, run_preflight
from megatron.preflight.samples import claim_sample_file
from tests.tiny import BARE

TINY = dict(BARE, tokenizer_type="CharLevelTokenizer")


def sample_findings(script="generate.py", **keys):
    keys.setdefault("text_gen_type", "unconditional")
    cfg = config_from_dict({**TINY, **keys}, world_size=1, vocab_size=512)
    return [f for f in run_preflight(cfg, script) if f.check == "sample_output_file"]


def test_a_file_with_samples_is_refused_with_the_next_free_name(tmp_path):
    earlier = tmp_path / "samples.jsonl"
    earlier.write_text('{"text": "a"}\n{"text": "b"}\n')
    (tmp_path / "samples-2.jsonl").write_text("x\n")
    [finding] = sample_findings(sample_output_file=str(earlier))
    assert finding.level == ERROR
    assert "already holds 2 line(s)" in finding.message
    assert f"--set sample_output_file={tmp_path / 'samples-3.jsonl'}" in finding.message
    with pytest.raises(ConfigError, match="not overwritten"):
        claim_sample_file(str(earlier))
    assert earlier.read_text() == '{"text": "a"}\n{"text": "b"}\n'


@pytest.mark.parametrize("existing", [None, ""])
def test_a_new_or_empty_file_is_named_in_the_report(tmp_path, existing):
    path = tmp_path / "out" / "deeper" / "samples.jsonl"
    if existing is not None:
        path.parent.mkdir(parents=True)
        path.write_text(existing)
    [finding] = sample_findings(sample_output_file=str(path))
    assert (finding.level, finding.message) == (OK, f"samples will be written to '{path}'")
    assert not path.exists() or path.read_text() == ""  # the pre-flight creates nothing
    assert claim_sample_file(str(path)) == path and path.read_text() == ""


def test_a_folder_or_a_path_through_a_file_is_refused(tmp_path):
    [folder] = sample_findings(sample_output_file=str(tmp_path))
    assert folder.level == ERROR and "is a folder" in folder.message
    (tmp_path / "a_file").write_text("")
    [through] = sample_findings(sample_output_file=str(tmp_path / "a_file" / "s.jsonl"))
    assert through.level == ERROR and "cannot be written" in through.message


@pytest.mark.parametrize(
    ("script", "gen_type"), [("train.py", "unconditional"), ("generate.py", "precompute")]
)
def test_runs_that_write_no_samples_are_not_checked(tmp_path, script, gen_type):
    earlier = tmp_path / "samples.jsonl"
    earlier.write_text("kept\n")
    keys = dict(text_gen_type=gen_type, sample_output_file=str(earlier), precompute_model_name="m")
    assert sample_findings(script, **keys) == []


def test_the_summary_names_the_file_and_shows_the_first_sample():
    first = {"context": "The king", "text": " rode out\n" + "x" * 400, "length": 9}
    second = {"context": "b", "text": "c", "length": 1}
    text = summary([first, second], Path("/runs/samples.jsonl"), show_one=True)
    lines = text.splitlines()
    assert lines[0] == "wrote 2 sample(s) to /runs/samples.jsonl"
    assert lines[1] == '  first prompt: "The king"'
    assert lines[2].startswith('  its sample (9 tokens): " rode out\\nxxx')
    assert lines[2].endswith('..."') and len(lines) == 3
    assert summary([first], Path("s.jsonl"), show_one=False) == "wrote 1 sample(s) to s.jsonl"
