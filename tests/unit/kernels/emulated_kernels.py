"""Builds the kernel sources of csrc/ for the CPU emulation (emulation/) and calls them.

`build(out_dir)` compiles the real .cu files with the host compiler against the stand-in CUDA
headers of emulation/ (each CUDA thread a coroutine; __syncthreads and warp shuffles are
yields) and returns an `EmulatedKernels` whose methods take CPU tensors and write their
output tensor like the PyTorch bindings do. Used by test_kernel_emulation.py and
test_emulated_ops.py; nothing here runs on a GPU.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from megatron.kernels.build import REPO_ROOT

CXX = shutil.which("g++")
EMULATION = Path(__file__).parent / "emulation"
KERNEL_FILES = ["fused_softmax_forward.cu", "fused_softmax_backward.cu", "fused_rotary.cu"]
FLAGS = ["-std=c++20", "-O1", "-fPIC", "-fno-strict-aliasing", "-w"]
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

I64, INT, F32, PTR = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
SIGNATURES = {
    "emu_softmax_forward": [INT, PTR, PTR, I64, I64, INT, PTR, I64, I64, INT, INT, F32],
    "emu_softmax_backward": [INT, PTR, PTR, PTR, INT, I64, INT, INT, F32],
    "emu_rotary": [INT, INT, INT, PTR, PTR, PTR, PTR, I64, I64, I64, INT, INT] + [I64] * 5,
}


class EmulatedKernels:
    """The kernels' host entry points (fused_softmax.h, fused_rotary.h) over CPU tensors."""

    def __init__(self, library: Path):
        self.handle = ctypes.CDLL(str(library))
        for name, argtypes in SIGNATURES.items():
            getattr(self.handle, name).argtypes = argtypes
            getattr(self.handle, name).restype = INT

    def softmax_forward(self, x, mask, scale, causal, out) -> int:
        """Returns the cudaError_t code (0 = success); `out` receives softmax(scale * x)."""
        sq, sk = x.shape[-2:]
        rows_per_batch = x.size(1) * sq if x.dim() == 4 else x.numel() // sk
        mask_ptr, stride_b, stride_q = None, 0, 0
        if mask is not None:
            mask_ptr = mask.data_ptr()
            stride_b = 0 if mask.size(0) == 1 else mask.stride(0)
            stride_q = 0 if mask.size(2) == 1 else mask.stride(2)
        return self.handle.emu_softmax_forward(
            DTYPE_CODES[x.dtype],
            x.data_ptr(),
            mask_ptr,
            stride_b,
            stride_q,
            int(causal),
            out.data_ptr(),
            x.numel() // sk,
            rows_per_batch,
            sq,
            sk,
            scale,
        )

    def softmax_backward(self, dy, y, scale, causal, grad) -> int:
        sq, sk = y.shape[-2:]
        return self.handle.emu_softmax_backward(
            DTYPE_CODES[y.dtype],
            dy.data_ptr(),
            y.data_ptr(),
            grad.data_ptr(),
            int(causal),
            y.numel() // sk,
            sq,
            sk,
            scale,
        )

    def rotary(self, x, cos, sin, out, backward: bool) -> int:
        """x may be strided on its first three dims; out, cos and sin are contiguous."""
        s, b, h, d = x.shape
        angle_stride_batch = cos.stride(1) if cos.size(1) > 1 else 0
        return self.handle.emu_rotary(
            int(backward),
            DTYPE_CODES[x.dtype],
            DTYPE_CODES[cos.dtype],
            x.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            out.data_ptr(),
            s,
            b,
            h,
            d,
            cos.size(-1),
            *x.stride()[:3],
            cos.stride(0),
            angle_stride_batch,
        )


def build(out_dir: Path) -> EmulatedKernels:
    """Compile (two files at a time) and link the emulation library in `out_dir`."""
    includes = [f"-I{EMULATION}", f"-I{REPO_ROOT / 'csrc'}"]
    jobs = [["-x", "c++", str(REPO_ROOT / "csrc" / name)] for name in KERNEL_FILES]
    jobs.append([str(EMULATION / "emu_api.cpp")])
    objects = [out_dir / f"{index}.o" for index in range(len(jobs))]

    def compile_one(index: int) -> subprocess.CompletedProcess:
        command = [CXX, *FLAGS, *includes, "-c", *jobs[index], "-o", str(objects[index])]
        return subprocess.run(command, capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, range(len(jobs))))
    for job, result in zip(jobs, results):
        if result.returncode != 0:
            raise RuntimeError(f"emulation build of {job[-1]} failed:\n{result.stderr}")
    library = out_dir / "libemulated_kernels.so"
    subprocess.run([CXX, "-shared", *map(str, objects), "-o", str(library)], check=True)
    return EmulatedKernels(library)
