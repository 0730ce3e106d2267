"""What the GPU kernel benchmarks share: dtypes, CUDA-event timing, the GPU/extension check and
the results file (`bench/results/{name}_{device}_{dtype}.json`)."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from megatron.kernels.loader import BUILD_HINT, load_extension  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def time_ms(fn, iters: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() over `iters` runs, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def missing_gpu_kernel(script: str, kernel: str) -> str | None:
    """Why `script` cannot measure the fused `kernel` here, or None when it can."""
    if not torch.cuda.is_available():
        return (
            f"{script}: no CUDA GPU (torch.cuda.is_available() is False); this benchmark "
            "measures GPU kernels, so nothing was measured."
        )
    if load_extension(kernel) is None:
        return f"{script}: the fused {kernel} extension is not built; {BUILD_HINT}."
    return None


def write_results(name: str, dtype: str, rows: list[dict], out: Path | None) -> Path:
    """Print the device line and write the rows as JSON; returns the file written."""
    device = torch.cuda.get_device_name()
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    out = out or REPO / "bench" / "results" / f"{name}_{slug}_{dtype}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = dict(device=device, dtype=dtype, torch=torch.__version__, rows=rows)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return out
