"""`tools/build_deepspeed_ops.py` says how its build goes, in a few lines, where it printed one
line and then nothing for the whole build (7.8 minutes on two CPU cores, pip's output held
back). Replayed from a real build's transcript (`tests/data/deepspeed_ops_build.log`, its
thousands of lines of copied files and compiler warnings left out of what is said), and run on
a process that stays silent."""

from __future__ import annotations

import os
import sys

from tests.tiny import REPO

sys.path.insert(0, str(REPO / "tools"))

import build_deepspeed_ops as tool  # noqa: E402

TRANSCRIPT = REPO / "tests" / "data" / "deepspeed_ops_build.log"


def test_a_real_build_is_told_step_by_step_with_the_time_taken():
    lines = [ln for ln in TRANSCRIPT.read_text().splitlines() if not ln.startswith("#")]
    now, said = 0.0, []
    progress = tool.BuildProgress(["deepspeed_shm_comm", "cpu_adam"], said.append, lambda: now)
    for line in lines:
        at, text = float(line[:6]), line[7:]
        while now + tool.POLL_S < at:  # pip is silent until then: run_watched's polls
            now += tool.POLL_S
            progress.tick()
        now = at
        progress.line(text)
    assert said == [
        "  0:00 fetching DeepSpeed's source",
        "  0:01 reading DeepSpeed's setup",
        "  0:07 building DeepSpeed",
        "  0:12 compiling deepspeed_shm_comm (op 1 of 2): csrc/cpu/comm/shm.cpp",
        "  1:16 compiling deepspeed_shm_comm (op 1 of 2): csrc/cpu/comm/shm_interface.cpp",
        "  2:17 still compiling deepspeed_shm_comm (op 1 of 2): csrc/cpu/comm/shm_interface.cpp",
        "  3:13 compiling cpu_adam (op 2 of 2): csrc/adam/cpu_adam.cpp",
        "  4:07 compiling cpu_adam (op 2 of 2): csrc/adam/cpu_adam_impl.cpp",
        "  5:08 still compiling cpu_adam (op 2 of 2): csrc/adam/cpu_adam_impl.cpp",
        "  6:12 still compiling cpu_adam (op 2 of 2): csrc/adam/cpu_adam_impl.cpp",
        "  6:18 packing the rebuilt DeepSpeed",
        "  6:39 installing the rebuilt DeepSpeed",
    ]


def test_a_silent_process_is_heard_from_and_its_end_kept():
    child = (
        "import time; print('Collecting deepspeed==0.19.8', flush=True); time.sleep(1.0); "
        "print('Installing collected packages: deepspeed'); raise SystemExit(3)"
    )
    said = []
    progress = tool.BuildProgress(["cpu_adam"], said.append, heartbeat_s=0.3)
    argv = [sys.executable, "-c", child]
    status, output = tool.run_watched(argv, dict(os.environ), progress, poll_s=0.05)
    assert status == 3 and output.endswith("Installing collected packages: deepspeed\n")
    assert said[0].endswith(" fetching DeepSpeed's source"), said
    assert any(s.endswith(" still fetching DeepSpeed's source") for s in said[1:-1]), said
    assert said[-1].endswith(" installing the rebuilt DeepSpeed"), said
