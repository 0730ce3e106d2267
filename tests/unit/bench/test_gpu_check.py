"""`bench/gpu_check.py --cpu`: the GPU acceptance run's logic at tiny sizes on the CPU.

A real run (subprocesses, real `deepy.py` launches) of the steps the CPU can take, checked for
the JSON schema a GPU run writes too: every planned step present with a known status, the
GPU-only ones skipped with their reason, the training runs' figures read from their
`metrics.jsonl`, and the resumed run's losses equal to the unbroken run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import free_port

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))

import gpu_check  # noqa: E402

pytestmark = pytest.mark.slow  # three deepy.py launches: about a minute on 2 cores


def test_cpu_mode_writes_the_schema_and_resumes_exactly(tmp_path):
    out = tmp_path / "check"
    only = "deepy_plain_bf16,resume_plain_bf16,deepy_fp16,resume_fp16,bench_softmax"
    env = {**os.environ, "MASTER_PORT": str(free_port()), "DS_ACCELERATOR": "cpu"}
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--cpu", "--out", str(out), "--only", only],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    check = json.loads((out / "gpu_check.json").read_text())
    assert done.returncode == 0, done.stdout[-3000:] + json.dumps(check["steps"], indent=1)[-3000:]
    assert tuple(check) == gpu_check.CHECK_KEYS and check["mode"] == "cpu"
    steps = {s["name"]: s for s in check["steps"]}
    assert list(steps) == [
        "environment",
        "bench_softmax",
        "deepy_plain_bf16",
        "resume_plain_bf16",
        "deepy_fp16_overflow",
        "resume_fp16_overflow",
    ]
    for step in check["steps"]:
        assert tuple(step) == gpu_check.STEP_KEYS and step["status"] in gpu_check.STATUSES
    assert steps["environment"]["metrics"]["torch"] == check["environment"]["torch"]
    for name in ("deepy_fp16_overflow", "resume_fp16_overflow", "bench_softmax"):
        assert steps[name]["status"] == "skipped" and steps[name]["reason"]
    first = steps["deepy_plain_bf16"]["metrics"]
    assert first["records"] == 6 and all(loss > 0 for loss in first["losses"])
    assert first["tokens_per_sec"] > 0
    resumed = steps["resume_plain_bf16"]["metrics"]
    assert resumed == {"iterations": [4, 5, 6], "max_abs_loss_difference": 0.0}
    assert check["summary"] == {"passed": 3, "failed": 0, "timeout": 0, "skipped": 3}
    assert "===== deepy_plain_bf16 =====" in (out / "gpu_check.log").read_text()


def test_a_step_that_fails_is_recorded_and_the_run_goes_on(tmp_path):
    # A step whose process fails and one that overruns its limit.
    steps = [gpu_check.Step("fails", argv=[sys.executable, "-c", "raise SystemExit(3)"]),
             gpu_check.Step("hangs", argv=[sys.executable, "-c", "import time; time.sleep(30)"],
                            timeout=1)]  # fmt: skip
    with open(tmp_path / "log", "w") as log:
        recs = [gpu_check.run_step(s, tmp_path, log, left=60) for s in steps]
    assert [r["status"] for r in recs] == ["failed", "timeout"]
    assert recs[0]["returncode"] == 3 and recs[0]["reason"] == "exit status 3"
    assert recs[1]["reason"] == "still running after 1 s"
