"""`tools/plan.py` and `deepy.py --dry-run` plan the configs users run, in seconds.

GPT-NeoX-20B (its own `20B.yml`, at the 96 GPUs it was trained on) must come out with the
parameter count of its paper (Black et al. 2022: 20,554,567,680); a config that does not fit
gets the changes that would make it fit, each of which does; `--json` names every term.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.config.resolve import load_settings, resolve_settings
from tools import plan as plan_tool

REPO = Path(__file__).resolve().parents[3]
NEOX_20B = REPO / "tests" / "data" / "configs" / "neox" / "20B.yml"
GPT_NEOX_20B_PARAMETERS = 20_554_567_680
NEOX_VOCAB = 50277  # GPT-NeoX-20B's tokenizer


def _json(capsys, argv) -> dict:
    assert plan_tool.main(argv + ["--json"]) == 0
    # (DeepSpeed's logger, made by an earlier test in this process, writes to pytest's capture)
    out = capsys.readouterr().out.splitlines()
    return json.loads("\n".join(line for line in out if not line.startswith("[20")))


def test_gpt_neox_20b_at_96_gpus(capsys):
    plan = _json(capsys, [str(NEOX_20B), "--world-size", "96", "--vocab-size", str(NEOX_VOCAB),
                          "--gpu", "A100-40GB"])  # fmt: skip
    layout = plan["layout"]
    assert (layout["dp"], layout["pp"], layout["tp"]) == (12, 4, 2)
    stages = plan["stages"]
    assert [s["layers"] for s in stages] == [[0, 10], [11, 22], [23, 33], [34, 43]]
    # per tensor-parallel rank: each of the 2 ranks holds half of every split tensor and all of
    # the replicated ones (layer norms, row-parallel biases: 6 h per layer, 2 h final norm)
    h = 6144
    replicated = 44 * 6 * h + 2 * h
    assert 2 * sum(s["parameters"] for s in stages) - replicated == GPT_NEOX_20B_PARAMETERS
    assert plan["fits"] is True and plan["wrapper"] == "DeepSpeedZeroOptimizer"
    for stage in stages:  # every term in bytes, and the total made of them
        persistent = sum(t["bytes"] for t in stage["model_states"].values() if not t["phases"])
        assert stage["persistent"] == persistent + sum(stage["kept_buffers"].values())
        assert stage["allocated"] == stage["persistent"] + max(stage["phases"].values())
        assert stage["total"] == stage["allocated"] + sum(stage["allowances"].values())
    assert plan["step_time"]["estimate"] is True and plan["step_time"]["seconds"] > 0


def test_a_sweep_plans_every_combination(capsys):
    argv = ["configs/llama-7B.yml", "--world-size", "8", "--vocab-size", "32000", "--gpu",
            "H100", "--sweep", "train_micro_batch_size_per_gpu=1,4",
            "--sweep", "zero_optimization.stage=0,1"]  # fmt: skip
    assert plan_tool.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and all("fits" in line and "s/step" in line for line in lines)
    plans = _json(capsys, argv)
    assert [p["sweep"] for p in plans][1] == ["train_micro_batch_size_per_gpu=1",
                                              "zero_optimization.stage=1"]  # fmt: skip


def test_what_does_not_fit_gets_changes_that_fit(capsys):
    base = ["configs/160M.yml", "--vocab-size", "50257", "--gpu", "L4",
            "--set", "checkpoint_activations=false"]  # fmt: skip
    plan = _json(capsys, base + ["--set", "train_micro_batch_size_per_gpu=32"])
    assert plan["fits"] is False
    first, largest = plan["advice"][:2]
    assert first.startswith("train_micro_batch_size_per_gpu: 16, gradient_accumulation_steps: 2")
    largest_batch = int(largest.split(":")[1].split()[0])
    fits = _json(capsys, base + ["--set", f"train_micro_batch_size_per_gpu={largest_batch}"])
    one_more = _json(
        capsys, base + ["--set", f"train_micro_batch_size_per_gpu={largest_batch + 1}"]
    )
    assert fits["fits"] is True and one_more["fits"] is False
    assert any(a.startswith("checkpoint_activations: true") for a in plan["advice"])


def test_deepy_dry_run_prints_the_plan_as_json():
    command = [sys.executable, "deepy.py", "train.py", "configs/160M.yml", "configs/local.yml",
               "--set", "plan_gpu=H100", "--dry-run", "--json"]  # fmt: skip
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert set(out) == {"config", "launch", "preflight", "memory_plan"}
    plan = out["memory_plan"]
    assert plan["machine"]["name"] == "H100" and plan["fits"] is True
    assert "optimizer state" in plan["stages"][0]["model_states"]


def test_the_tool_prints_the_plan_and_nothing_of_deepspeeds():
    """Its console is the plan: DeepSpeed's import guessed the device and warned on every run."""
    command = [sys.executable, "tools/plan.py", str(NEOX_20B), "--world-size", "96",
               "--vocab-size", str(NEOX_VOCAB), "--gpu", "A100-40GB"]  # fmt: skip
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("memory plan, per rank (A100-40GB")
    assert "Setting accelerator" not in run.stdout + run.stderr, run.stderr


def test_a_launch_that_would_not_fit_is_warned_of(caplog, tmp_path):
    import deepy

    files = ["configs/160M.yml", "configs/local.yml"]
    overrides = ["gpu_memory_gib=2", "train_micro_batch_size_per_gpu=8"]
    args = argparse.Namespace(script="train.py", configs=files, overrides=overrides)
    settings = load_settings(files, args.overrides)
    cfg = resolve_settings(settings, world_size=1, vocab_size=50257, warn=[], training=True)
    with caplog.at_level(logging.WARNING, logger="deepy"):
        deepy.warn_if_it_does_not_fit(args, cfg)
    (record,) = caplog.records
    assert "memory plan: stage 0 needs" in record.message and "it would fit with" in record.message


@pytest.mark.parametrize("argv", [["--gpus"]])
def test_the_gpu_table_lists_memory_and_peaks(capsys, argv):
    assert plan_tool.main(argv) == 0
    out = capsys.readouterr().out
    assert "H100" in out and "79.1 GiB" in out and "989" in out
