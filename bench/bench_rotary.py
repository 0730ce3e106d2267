"""Fused rotary embedding kernel vs the PyTorch reference, on a GPU.

    python bench/bench_rotary.py [--dtype bf16] [--rotary-pct 1.0 0.25]

For GPT-sized query tensors (seq, batch, heads, head_dim), measures with CUDA events (median
of --iters runs after warm-up) the forward and the backward of the fused kernel and of the
PyTorch reference (`x * cos + rotate_half(x) * sin` plus the pass-through concat), and a
`clone()` of the same tensor as the bandwidth ceiling. Bandwidth = bytes a perfect kernel
moves (read x, write the result) / time, also as a fraction of clone's.

Prints a table and writes bench/results/rotary_<gpu>_<dtype>.json. Needs a CUDA GPU and the
built extension (`python -m megatron.kernels.build`); exits with a message otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from gpu_bench import (  # puts the repo on sys.path
    DTYPES,
    missing_gpu_kernel,
    time_ms,
    write_results,
)

from megatron.kernels.rotary import apply_rotary

SHAPES = [(2048, 8, 32, 128), (4096, 4, 32, 128), (8192, 2, 16, 64), (16384, 1, 32, 128)]


def angle_tables(seq: int, rot_dim: int, dtype: torch.dtype):
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot_dim, 2, device="cuda").float() / rot_dim)
    freqs = torch.outer(torch.arange(seq, device="cuda").float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def measure(shape, rotary_pct: float, dtype: torch.dtype, iters: int) -> list[dict]:
    x = torch.randn(shape, device="cuda", dtype=dtype)
    grad = torch.randn_like(x)
    cos, sin = angle_tables(shape[0], int(shape[-1] * rotary_pct), dtype)
    nbytes = x.numel() * x.element_size()
    copy_ms = time_ms(x.clone, iters)
    copy_bw = 2 * nbytes / copy_ms / 1e6  # GB/s

    def backward(fused: bool):
        leaf = x.detach().requires_grad_()
        out = apply_rotary(leaf, cos, sin, fused=fused)
        return lambda: torch.autograd.grad(out, leaf, grad, retain_graph=True)

    cases = [
        ("copy (clone)", "-", None),
        ("fwd", "fused", lambda: apply_rotary(x, cos, sin, fused=True)),
        ("fwd", "eager", lambda: apply_rotary(x, cos, sin, fused=False)),
        ("bwd", "fused", backward(True)),
        ("bwd", "eager", backward(False)),
    ]
    rows = []
    for op, impl, fn in cases:
        ms = copy_ms if fn is None else time_ms(fn, iters)
        bandwidth = 2 * nbytes / ms / 1e6
        rows.append(
            dict(
                shape=list(shape),
                rotary_pct=rotary_pct,
                op=op,
                impl=impl,
                ms=ms,
                gb_per_s=bandwidth,
                fraction_of_copy=bandwidth / copy_bw,
            )
        )
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        f"{'shape (s,b,h,d)':<22} {'pct':>5} {'op':<13} {'impl':<6} {'ms':>8} {'GB/s':>7} "
        f"{'of copy':>8}"
    )
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        print(
            f"{shape:<22} {r['rotary_pct']:>5} {r['op']:<13} {r['impl']:<6} {r['ms']:>8.3f} "
            f"{r['gb_per_s']:>7.0f} {r['fraction_of_copy']:>8.0%}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--rotary-pct", type=float, nargs="+", default=[1.0, 0.25])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args(argv)

    problem = missing_gpu_kernel("bench_rotary.py", "rotary")
    if problem:
        print(problem, file=sys.stderr)
        return 2

    dtype = DTYPES[args.dtype]
    device = torch.cuda.get_device_name()
    rows = [
        row
        for shape in SHAPES
        for pct in args.rotary_pct
        for row in measure(shape, pct, dtype, args.iters)
    ]
    print(f"{device}, {args.dtype}, torch {torch.__version__}")
    print_table(rows)
    write_results("rotary", args.dtype, rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
