"""`python deepy.py eval.py CONFIG` on 2 CPU ranks (a pipeline of 2 stages, the checkpoint
saved at tp=2, pp=2) with the local lm-eval tasks of `tests/data/lm_eval_task` (multiple
choice, rolling loglikelihood, generation) and docs/checkpoints.md's offline task of
`configs/lm_eval` (last words of Shakespeare; nothing downloaded) gives the results `lm-eval`
gives for the exported Hugging Face model: the same accuracies and generations, perplexities
equal to 1e-6. The export keeps only the tokenizer's rows (`--vocab-size`), since our scoring
normalises over the real vocabulary, never over the rows padding the table."""

from __future__ import annotations

import json

import pytest

from tests.distributed import free_port
from tests.e2e.test_generate_deepy import deepy
from tests.tiny import HF_VOCAB, REPO
from tests.unit.tools.tiny_checkpoints import trained

lm_eval = pytest.importorskip("lm_eval")

pytestmark = pytest.mark.slow
TASK_DIR = REPO / "tests" / "data" / "lm_eval_task"
SHIPPED = REPO / "configs" / "lm_eval"  # docs/checkpoints.md's offline task
TASKS = ["tiny_mc", "tiny_ppl", "tiny_gen", "shakespeare_lastword"]


def _hf_results(hf_dir, monkeypatch) -> dict:
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={hf_dir},dtype=float32",
        tasks=TASKS,
        task_manager=TaskManager(include_path=[str(TASK_DIR), str(SHIPPED)]),
        device="cpu",
        batch_size=8,
        log_samples=True,
    )


def test_eval_py_matches_lm_eval_on_the_exported_model(tmp_path, monkeypatch):
    from megatron.evaluation import sample_lines
    from tools import convert_to_hf

    run = trained()["neox"]
    step2 = run["folder"] / "ckpt" / "global_step2"
    prefix = tmp_path / "ours"
    config = dict(
        run["settings"],
        load=str(step2),
        save=None,
        num_gpus=2,
        master_port=free_port(),
        model_parallel_size=1,
        pipe_parallel_size=2,
        eval_tasks=[str(TASK_DIR), "configs/lm_eval", *TASKS],
        eval_results_prefix=str(prefix),
    )
    deepy("eval.py", config, tmp_path)
    ours = json.loads((tmp_path / "ours_eval_results.json").read_text())
    assert ours["pipe_parallel_size"] == 2 and ours["model_parallel_size"] == 1

    hf_dir = tmp_path / "hf"
    export = ["--checkpoint", str(step2), "--output", str(hf_dir), "--vocab-size", str(HF_VOCAB)]
    assert convert_to_hf.main(export) == 0
    theirs = _hf_results(hf_dir, monkeypatch)
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"]["tiny_mc"][metric] == theirs["results"]["tiny_mc"][metric]
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        expected = theirs["results"]["tiny_ppl"][metric]
        assert ours["results"]["tiny_ppl"][metric] == pytest.approx(expected, rel=1e-6)
    lastword = ours["results"]["shakespeare_lastword"]
    assert lastword["acc,none"] == theirs["results"]["shakespeare_lastword"]["acc,none"]
    expected = theirs["results"]["shakespeare_lastword"]["perplexity,none"]
    assert lastword["perplexity,none"] == pytest.approx(expected, rel=1e-6)
    assert ours["n-samples"]["shakespeare_lastword"]["effective"] == 210
    assert (
        ours["results"]["tiny_gen"]["exact_match,none"]
        == (theirs["results"]["tiny_gen"]["exact_match,none"])
    )

    ours_gen = _generations(_read_jsonl(tmp_path / "ours_eval_samples.jsonl"))
    theirs_gen = _generations([json.loads(line) for line in sample_lines(theirs)])
    assert len(ours_gen) == 6 and ours_gen == theirs_gen
    assert any(text.strip() for text in ours_gen.values())  # something was generated


def _read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _generations(samples: list[dict]) -> dict:
    return {s["doc_id"]: s["filtered_resps"][0] for s in samples if s["task"] == "tiny_gen"}
