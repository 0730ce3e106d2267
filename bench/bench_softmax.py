"""Fused softmax kernels vs PyTorch eager softmax and scaled_dot_product_attention, on a GPU.

    python bench/bench_softmax.py [--dtype bf16] [--seqs 1024 2048 4096 8192 16384]

For each sequence length s (causal, sq = sk = s, batch x heads chosen so the scores hold
2^28 elements), measures with CUDA events (median of --iters runs after warm-up):

* copy: `scores.clone()`, which reads and writes the score bytes once: the bandwidth ceiling;
* softmax forward and backward, fused kernel vs PyTorch eager in the same dtype
  (`softmax((scale * x).masked_fill(causal, -inf))` and its autograd backward), for the causal
  kernel and the explicit-mask kernel. Bandwidth = the bytes a perfect kernel moves (forward:
  read x, write y; backward: read dy and y, write dx) / time, and its fraction of copy's;
* attention: q @ k^T, fused causal softmax, @ v (head_dim 128) vs
  `torch.nn.functional.scaled_dot_product_attention(is_causal=True)`: times only, since SDPA
  never materialises the scores.

Prints a table and writes bench/results/softmax_<gpu>_<dtype>.json. Needs a CUDA GPU and the
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

from megatron.kernels.softmax_cuda import fused_scaled_masked_softmax
from megatron.kernels.softmax_reference import causal_mask

ELEMENTS = 2**28  # scores per measurement (512 MiB in 16-bit)
HEAD_DIM = 128


def eager_softmax(x, mask, scale):
    return torch.softmax((x * scale).masked_fill(mask, float("-inf")), dim=-1)


def backward_fn(forward, x, grad):
    """A callable running only the backward of forward(x) (the graph is built once)."""
    x = x.detach().requires_grad_()
    out = forward(x)
    return lambda: torch.autograd.grad(out, x, grad, retain_graph=True)


def measure(seq: int, dtype: torch.dtype, iters: int) -> list[dict]:
    heads = max(1, ELEMENTS // (seq * seq))
    shape = (1, heads, seq, seq)
    scale = HEAD_DIM**-0.5
    x = torch.randn(shape, device="cuda", dtype=dtype)
    grad = torch.randn_like(x)
    upper = causal_mask(seq, seq, "cuda")
    padding = torch.rand(1, 1, seq, seq, device="cuda") < 0.1
    nbytes = x.numel() * x.element_size()

    copy_ms = time_ms(x.clone, iters)
    copy_bw = 2 * nbytes / copy_ms / 1e6  # GB/s

    def fused_causal(t):
        return fused_scaled_masked_softmax(t, None, scale, causal=True)

    def fused_masked(t):
        return fused_scaled_masked_softmax(t, padding, scale)

    def eager_causal(t):
        return eager_softmax(t, upper, scale)

    def eager_masked(t):
        return eager_softmax(t, padding, scale)

    cases = [
        ("copy (clone)", "-", lambda: x.clone(), 2),
        ("causal fwd", "fused", lambda: fused_causal(x), 2),
        ("causal fwd", "eager", lambda: eager_causal(x), 2),
        ("causal bwd", "fused", backward_fn(fused_causal, x, grad), 3),
        ("causal bwd", "eager", backward_fn(eager_causal, x, grad), 3),
        ("mask fwd", "fused", lambda: fused_masked(x), 2),
        ("mask fwd", "eager", lambda: eager_masked(x), 2),
        ("mask bwd", "fused", backward_fn(fused_masked, x, grad), 3),
        ("mask bwd", "eager", backward_fn(eager_masked, x, grad), 3),
    ]
    rows = []
    for op, impl, fn, passes in cases:
        ms = copy_ms if op.startswith("copy") else time_ms(fn, iters)
        bandwidth = passes * nbytes / ms / 1e6
        rows.append(
            dict(
                seq=seq,
                heads=heads,
                op=op,
                impl=impl,
                ms=ms,
                gb_per_s=bandwidth,
                fraction_of_copy=bandwidth / copy_bw,
            )
        )

    q, k, v = (torch.randn(1, heads, seq, HEAD_DIM, device="cuda", dtype=dtype) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def matmul_fused_attention():
        scores = torch.matmul(q, k.transpose(-1, -2))
        return torch.matmul(fused_causal(scores), v)

    for impl, fn in (
        ("matmul+fused", matmul_fused_attention),
        ("sdpa", lambda: sdpa(q, k, v, is_causal=True, scale=scale)),
    ):
        rows.append(
            dict(
                seq=seq,
                heads=heads,
                op="attention fwd",
                impl=impl,
                ms=time_ms(fn, iters),
                gb_per_s=None,
                fraction_of_copy=None,
            )
        )
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'seq':>6} {'b*np':>5} {'op':<14} {'impl':<13} {'ms':>9} {'GB/s':>8} {'of copy':>8}")
    for r in rows:
        bw = "-" if r["gb_per_s"] is None else f"{r['gb_per_s']:.0f}"
        frac = "-" if r["fraction_of_copy"] is None else f"{r['fraction_of_copy']:.0%}"
        print(
            f"{r['seq']:>6} {r['heads']:>5} {r['op']:<14} {r['impl']:<13} "
            f"{r['ms']:>9.3f} {bw:>8} {frac:>8}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args(argv)

    problem = missing_gpu_kernel("bench_softmax.py", "softmax")
    if problem:
        print(problem, file=sys.stderr)
        return 2

    dtype = DTYPES[args.dtype]
    device = torch.cuda.get_device_name()
    rows = [row for seq in args.seqs for row in measure(seq, dtype, args.iters)]
    print(f"{device}, {args.dtype}, torch {torch.__version__}")
    print_table(rows)
    write_results("softmax", args.dtype, rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
