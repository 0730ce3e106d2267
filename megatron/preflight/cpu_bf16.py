"""Pre-flight check of bf16 on a CPU: is this CPU's bf16 matmul fast, or emulated?

A CPU without bf16 matrix instructions (AVX-512 BF16, AMX) multiplies bf16 matrices through a
slow path: on a 2-core AVX2 AMD EPYC 0.9 GFLOP/s against 68.7 in fp32, so 160M.yml's bf16 did
not reach iteration 10 in 30 minutes. When the launch runs its ranks on this machine and it
has no GPU, the same matmul is timed in both dtypes on one core (a few tenths of a second);
bf16 more than `SLOWER` times slower warns, naming both speeds and `--set precision=fp32`. A
launch on other nodes, or on GPUs, is not checked: this machine says nothing about theirs.
"""

from __future__ import annotations

import time
from pathlib import Path

from megatron.config import Config
from megatron.launcher.errors import LauncherError
from megatron.preflight.findings import OK, WARNING, Finding, register

NAME = "cpu_bf16"
SLOWER = 4.0  # bf16 this many times slower than fp32 is emulation, not a slightly slower unit
SIZE = 256  # the timed matmul: SIZE x SIZE times SIZE x SIZE
MIN_SECONDS = 0.05  # each dtype is timed for at least this long
MIN_RUNS = 5  # and at least this many times
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 /proc/cpuinfo flags of bf16 matrix units


def matmul_gflops(size: int = SIZE) -> tuple[float, float]:
    """GFLOP/s of a `size`-cubed matmul on one core of this CPU, `(bf16, fp32)`: the best of
    at least `MIN_RUNS` runs of each, taken in turns. One thread, because on a busy machine a
    multi-threaded matmul waits for its slowest thread every run (at a load of 10 on two
    cores, fp32 measured 2 GFLOP/s with two threads and the emulation went unnoticed), while
    one thread's best run is one that was not preempted."""
    import torch

    pairs = [(torch.randn(size, size).to(d), torch.randn(size, size).to(d))
             for d in (torch.bfloat16, torch.float32)]  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best, spent, runs = [float("inf")] * 2, [0.0] * 2, [0] * 2
        for a, b in pairs:
            torch.mm(a, b)  # warm-up: the first call picks and prepares its kernel
        while any(t < MIN_SECONDS or n < MIN_RUNS for t, n in zip(spent, runs)):
            for i, (a, b) in enumerate(pairs):
                start = time.perf_counter()
                torch.mm(a, b)
                took = time.perf_counter() - start
                best[i], spent[i], runs[i] = min(best[i], took), spent[i] + took, runs[i] + 1
    finally:
        torch.set_num_threads(threads)
    bf16, fp32 = (2 * size**3 / t / 1e9 for t in best)
    return bf16, fp32


def bf16_cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str] | None:
    """Which of the bf16 matrix flags this x86 CPU lists (None where /proc/cpuinfo says nothing
    of x86 flags: another architecture or system)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), None)  # fmt: skip
    return None if flags is None else [f for f in BF16_FLAGS if f in flags]


def _runs_on_this_cpu(cfg: Config) -> bool:
    """Whether the launch starts its ranks on this machine, and this machine has no GPU."""
    from megatron.launcher.plan import local_device_count, plan_resources

    try:
        resources = plan_resources(cfg.launcher)
    except LauncherError:  # the hostfile check reports it
        return False
    local = not resources.multi_node and resources.hosts == ["localhost"]
    return local and local_device_count() == 0


def slowdown_finding(bf16: float, fp32: float, flags: list[str] | None) -> Finding:
    """The finding for measured bf16 and fp32 matmul speeds (GFLOP/s) on this CPU."""
    speeds = f"bf16 matmul {bf16:.1f} GFLOP/s against {fp32:.1f} in fp32 on one core of this CPU"
    if fp32 <= SLOWER * bf16:
        return Finding(NAME, OK, speeds)
    missing = f", which has no {' or '.join(BF16_FLAGS)}" if flags == [] else ""
    return Finding(
        NAME,
        WARNING,
        f"precision bf16: {speeds}{missing} ({fp32 / bf16:.0f}x slower: bf16 is emulated "
        "here); every step will take about that much longer: --set precision=fp32 for a run "
        "on this CPU",
    )


@register(NAME, reads_worker_files=False)
def check_cpu_bf16(cfg: Config, script: str) -> list[Finding]:
    """bf16 ranks on this CPU: warn when its bf16 matmul is emulated."""
    if cfg.precision.dtype != "bf16" or not _runs_on_this_cpu(cfg):
        return []
    bf16, fp32 = matmul_gflops()
    return [slowdown_finding(bf16, fp32, bf16_cpu_flags())]
