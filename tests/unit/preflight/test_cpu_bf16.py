"""bf16 ranks on a CPU whose bf16 matmul is emulated are warned about before launch, with both
speeds and `--set precision=fp32`; fp32 runs, launches on other nodes and fast bf16 are not.

The real measurement is held against the CPU's own flags (/proc/cpuinfo): a CPU with AVX-512
BF16 or AMX is never warned about, and an AVX2-only x86 CPU (no AVX-512 at all), whose bf16
matmul the issue measured 75x slower, is."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron.config import config_from_dict
from megatron.preflight import OK, WARNING, run_preflight
from megatron.preflight.cpu_bf16 import (
    SLOWER,
    bf16_cpu_flags,
    matmul_gflops,
    slowdown_finding,
)
from tests.tiny import BARE, REPO

TINY = dict(BARE, tokenizer_type="CharLevelTokenizer")


def bf16_findings(**keys):
    cfg = config_from_dict({**TINY, **keys}, world_size=1, vocab_size=512)
    return [f for f in run_preflight(cfg, "train.py") if f.check == "cpu_bf16"]


def test_the_issues_avx2_figures_warn_with_both_speeds_and_the_fix():
    finding = slowdown_finding(0.9, 68.7, [])
    assert finding.level == WARNING
    assert finding.message.startswith(
        "precision bf16: bf16 matmul 0.9 GFLOP/s against 68.7 in fp32 on one core of this CPU, "
        "which has no avx512_bf16 or amx_bf16 (76x slower: bf16 is emulated here)"
    )
    assert finding.message.endswith("--set precision=fp32 for a run on this CPU")
    assert slowdown_finding(0.9, 68.7, None).message.count("which has no") == 0
    assert slowdown_finding(860.7, 342.7, ["amx_bf16"]).level == OK
    assert slowdown_finding(20.0, 60.0, []).level == OK  # 3x: slower, not emulated


@contextlib.contextmanager
def busy_cores(n: int):
    """`n` processes spinning on the CPU, as other ranks or jobs would (a load of n)."""
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(spin) for _ in range(n)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.parametrize("busy", [0, 4], ids=["idle", "a load of 4 more"])
def test_the_measurement_agrees_with_the_cpus_flags(busy):
    """Also on a busy machine: with the cores shared by four spinning processes, two-thread
    timing once took the AVX2 EPYC's fp32 matmul for 2 GFLOP/s and missed the emulation."""
    with busy_cores(busy):
        bf16, fp32 = matmul_gflops()
    assert bf16 > 0 and fp32 > 0
    flags = bf16_cpu_flags()
    if flags:
        assert fp32 <= SLOWER * bf16, (bf16, fp32, flags)
        return
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if flags is None or "avx512f" in cpuinfo or " avx2" not in cpuinfo:
        pytest.skip("neither a bf16 matrix unit nor an AVX2-only x86 CPU")
    assert fp32 > SLOWER * bf16, (bf16, fp32)


def test_cpu_flags_are_read_from_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n")
    assert bf16_cpu_flags(str(cpuinfo)) == ["amx_bf16"]
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")  # aarch64
    assert bf16_cpu_flags(str(cpuinfo)) is None
    assert bf16_cpu_flags(str(tmp_path / "none")) is None


def test_only_bf16_ranks_on_this_cpu_are_timed(tmp_path):
    [finding] = bf16_findings(precision="bf16")
    assert finding.level in (OK, WARNING) and "GFLOP/s" in finding.message
    assert bf16_findings(precision="fp32") == []
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\n")
    assert bf16_findings(precision="bf16", hostfile=str(hostfile)) == []


def test_deepy_warns_on_a_cpu_limited_to_avx2(tmp_path):
    """oneDNN and ATen held to AVX2 on this CPU, as on the issue's AMD EPYC: `deepy.py
    --dry-run` of a bf16 run prints the warning before launch (the run is not refused)."""
    config = tmp_path / "bf16.yml"
    config.write_text(json.dumps({**TINY, "precision": "bf16", "data_impl": "dummy"}))
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    proc = subprocess.run(
        [sys.executable, "deepy.py", "train.py", str(config), "--dry-run"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "deepy: pre-flight cpu_bf16: precision bf16: bf16 matmul" in proc.stderr
    assert "--set precision=fp32 for a run on this CPU" in proc.stderr
