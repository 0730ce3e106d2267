"""Where one training step's time goes on a GPU: `torch.profiler` over one step, reduced to the
figures that say what to fix. `device_busy_ms` against `wall_ms` says whether the GPU waited for
the host (launch-bound eager code); `by_kind` splits the kernel time into matrix multiplies,
attention, the optimizer and the rest; `top` names the costliest kernels. Used by
bench_gpu_train.py's `--profile`."""

from __future__ import annotations

import time

import torch

KINDS = (  # (kind, substrings of a kernel's lower-cased name), first match wins
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "nvjet", "cutlass", "cublas", "sm90_xmma", "wgmma")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("norm", ("layer_norm", "layernorm", "rms")),
    ("softmax_loss", ("softmax", "cross_entropy", "nll", "logsumexp")),
    ("reduce_copy", ("reduce", "copy", "cat", "fill")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "elementwise")


def _device_ms(event) -> float:
    """An averaged kernel entry's own device time in ms (the attribute was renamed in torch 2.4)."""
    value = getattr(event, "self_device_time_total", None)
    if value is None:
        value = getattr(event, "self_cuda_time_total", 0.0)
    return value / 1000.0


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_step(step, batch, top: int = 15) -> tuple[dict, str]:
    """Run `step(batch)` once under the profiler: (figures, the profiler's own table). Without
    CUDA the step is profiled on the CPU alone: no kernels, `device_busy_ms` 0."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    _sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        step(batch)
        _sync()
        wall = (time.perf_counter() - start) * 1000.0
    averages = prof.key_averages()
    kernels = [e for e in averages if str(getattr(e, "device_type", "")).endswith("CUDA")]
    # (a `record_function` range, "Optimizer.step#AdamW.step", shows on the GPU's timeline
    # too, spanning kernels counted on their own: not a kernel)
    kernels = [e for e in kernels if _device_ms(e) > 0 and "#" not in e.key]
    kernels.sort(key=_device_ms, reverse=True)
    by_kind: dict[str, float] = {}
    for e in kernels:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + _device_ms(e)
    figures = dict(
        wall_ms=wall,
        device_busy_ms=sum(map(_device_ms, kernels)),
        kernel_launches=sum(e.count for e in kernels),
        by_kind_ms={k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        top=[
            dict(kernel=e.key[:120], ms=round(_device_ms(e), 3), calls=e.count)
            for e in kernels[:top]
        ],  # fmt: skip
    )
    sort = "self_cuda_time_total"
    table = averages.table(sort_by=sort, row_limit=30, max_name_column_width=90)
    return figures, table
