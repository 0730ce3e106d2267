"""The CUDA kernels of csrc/, run on the CPU by an emulation of CUDA threads.

The real kernel sources (.cu) are compiled by the host compiler against the stand-in CUDA
headers of emulation/ (each CUDA thread a coroutine; barriers and warp shuffles as yields)
and called through ctypes on CPU tensors, with the checks of the GPU tests: outputs filled
with NaN first, a float64 reference, relative error <= 1e-3 after rounding the reference to
the output dtype. This proves indexing, layouts, masking, reductions and the launch dispatch
of the actual sources on a machine without a GPU; not the hardware memory model, nor speed.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from megatron.kernels.build import REPO_ROOT
from megatron.kernels.rotary_reference import reference_rotary
from megatron.kernels.softmax_reference import (
    reference_scaled_masked_softmax,
    reference_softmax_backward,
)
from tests.unit.kernels.gpu_support import BOUND, rounded_relative_error

CXX = shutil.which("g++")
EMULATION = Path(__file__).parent / "emulation"
KERNEL_FILES = ["fused_softmax_forward.cu", "fused_softmax_backward.cu", "fused_rotary.cu"]
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
SCALE = 0.3

pytestmark = pytest.mark.skipif(CXX is None, reason="g++ is needed to build the CPU emulation")

I64, INT, F32, PTR = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
SIGNATURES = {
    "emu_softmax_forward": [INT, PTR, PTR, I64, I64, INT, PTR, I64, I64, INT, INT, F32],
    "emu_softmax_backward": [INT, PTR, PTR, PTR, INT, I64, INT, INT, F32],
    "emu_rotary": [INT, INT, INT, PTR, PTR, PTR, PTR, I64, I64, I64, INT, INT, I64, I64, I64],
}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("emulation")
    flags = [
        "-std=c++20",
        "-O1",
        "-fPIC",
        "-fno-strict-aliasing",
        "-w",
        f"-I{EMULATION}",
        f"-I{REPO_ROOT / 'csrc'}",
    ]
    jobs = [["-x", "c++", str(REPO_ROOT / "csrc" / name)] for name in KERNEL_FILES]
    jobs.append([str(EMULATION / "emu_api.cpp")])

    def compile_one(index_job):
        index, job = index_job
        command = [CXX, *flags, "-c", *job, "-o", str(out / f"{index}.o")]
        return subprocess.run(command, capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, enumerate(jobs)))
    for job, result in zip(jobs, results):
        assert result.returncode == 0, f"emulation build of {job[-1]} failed:\n{result.stderr}"
    library = out / "libemulated_kernels.so"
    objects = [str(out / f"{i}.o") for i in range(len(jobs))]
    subprocess.run([CXX, "-shared", *objects, "-o", str(library)], check=True)
    handle = ctypes.CDLL(str(library))
    for name, argtypes in SIGNATURES.items():
        getattr(handle, name).argtypes = argtypes
        getattr(handle, name).restype = INT
    return handle


def softmax_forward(lib, x, mask, causal):
    out = torch.full_like(x, float("nan"))
    b, heads, sq, sk = x.shape
    mask_ptr, stride_b, stride_q = None, 0, 0
    if mask is not None:
        mask_ptr = mask.data_ptr()
        stride_b = 0 if mask.size(0) == 1 else mask.stride(0)
        stride_q = 0 if mask.size(2) == 1 else mask.stride(2)
    rows = x.numel() // sk
    status = lib.emu_softmax_forward(
        DTYPE_CODES[x.dtype],
        x.data_ptr(),
        mask_ptr,
        stride_b,
        stride_q,
        int(causal),
        out.data_ptr(),
        rows,
        heads * sq,
        sq,
        sk,
        SCALE,
    )
    assert status == 0
    return out


def softmax_backward(lib, dy, y, causal):
    grad = torch.full_like(y, float("nan"))
    sq, sk = y.shape[-2:]
    status = lib.emu_softmax_backward(
        DTYPE_CODES[y.dtype],
        dy.data_ptr(),
        y.data_ptr(),
        grad.data_ptr(),
        int(causal),
        y.numel() // sk,
        sq,
        sk,
        SCALE,
    )
    assert status == 0
    return grad


def make_mask(kind, shape, generator):
    b, _, sq, sk = shape
    mask_shapes = {
        "mask": (b, 1, sq, sk),
        "causal+mask": (b, 1, sq, sk),
        "shared-mask": (1, 1, sq, sk),
        "key-mask": (b, 1, 1, sk),
    }
    if kind not in mask_shapes:
        return None
    mask = torch.rand(mask_shapes[kind], generator=generator) < 0.2
    if mask.size(2) > 1:
        mask[0, 0, 0, :] = True  # a fully masked row
    else:
        mask[0, 0, 0, ::3] = True
    return mask


def check_softmax(lib, shape, dtype, kind, x=None):
    generator = torch.Generator().manual_seed(sum(shape))
    if x is None:
        x = (4 * torch.randn(shape, generator=generator)).to(dtype)
    mask = make_mask(kind, shape, generator)
    causal = kind.startswith("causal")
    expected = reference_scaled_masked_softmax(x.double(), mask, SCALE, causal=causal)
    out = softmax_forward(lib, x, mask, causal)
    assert not out.isnan().any(), "forward left elements unwritten (NaN) or produced NaN"
    assert rounded_relative_error(out, expected) <= BOUND

    y = expected.to(dtype)
    dy = torch.randn(shape, generator=generator).to(dtype)
    grad = softmax_backward(lib, dy, y, causal)
    assert not grad.isnan().any(), "backward left elements unwritten (NaN) or produced NaN"
    assert (
        rounded_relative_error(grad, reference_softmax_backward(dy.double(), y.double(), SCALE))
        <= BOUND
    )


SMALL_SHAPES = [(2, 3, 7, 7), (2, 2, 9, 24), (1, 2, 5, 1000)]
MASKS = ["causal", "causal+mask", "mask", "shared-mask", "key-mask", "none"]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SMALL_SHAPES)
@pytest.mark.parametrize("kind", MASKS)
def test_softmax_kernels(lib, shape, dtype, kind):
    check_softmax(lib, shape, dtype, kind)


@pytest.mark.parametrize(
    "shape,dtype,kind",
    [
        ((1, 1, 3, 3001), torch.bfloat16, "causal+mask"),  # 256 threads a row, element-wise
        ((1, 1, 2, 16384), torch.float16, "mask"),  # 1024 threads x 16 elements
        ((1, 1, 2, 20000), torch.bfloat16, "key-mask"),  # 1024 threads x 32 elements
        ((1, 1, 2, 16385), torch.float32, "causal"),  # the same, element-wise
    ],
)
def test_softmax_long_rows(lib, shape, dtype, kind):
    check_softmax(lib, shape, dtype, kind)


def test_softmax_misaligned_tensors(lib):
    shape = (1, 2, 6, 64)
    x = torch.randn(2 * 6 * 64 + 1).half()[1:].view(shape)  # 2 bytes off: element-wise path
    check_softmax(lib, shape, torch.float16, "mask", x=x)


def test_softmax_rejects_rows_past_the_limit(lib):
    x = torch.zeros(1, 32769, dtype=torch.float16)
    status = lib.emu_softmax_forward(
        1, x.data_ptr(), None, 0, 0, 0, x.data_ptr(), 1, 1, 1, 32769, 1.0
    )
    assert status == 1  # cudaErrorInvalidValue


def rotary(lib, x, cos, sin, backward):
    out = torch.full(x.shape, float("nan"), dtype=x.dtype)
    s, b, h, d = x.shape
    status = lib.emu_rotary(
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
    )
    assert status == 0
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,rotary_pct", [((5, 2, 3, 16), 1.0), ((7, 1, 5, 80), 0.25)])
@pytest.mark.parametrize("fp32_tables", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_rotary_kernel(lib, dtype, shape, rotary_pct, fp32_tables, strided):
    generator = torch.Generator().manual_seed(1)
    s, b, h, d = shape
    rot_dim = int(d * rotary_pct)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot_dim, 2).double() / rot_dim)
    emb = torch.outer(torch.arange(s).double(), inv_freq).repeat(1, 2)[:, None, None, :]
    table_dtype = torch.float32 if fp32_tables else dtype
    cos, sin = emb.cos().to(table_dtype), emb.sin().to(table_dtype)
    x = torch.randn(s, b, h, 3 * d if strided else d, generator=generator).to(dtype)[..., :d]

    x64 = x.double().requires_grad_()
    expected = reference_rotary(x64, cos.double(), sin.double())
    out = rotary(lib, x, cos, sin, backward=False)
    assert not out.isnan().any()
    assert rounded_relative_error(out, expected.detach()) <= BOUND

    dy = torch.randn(shape, generator=generator).to(dtype)
    (expected_grad,) = torch.autograd.grad(expected, x64, dy.double())
    grad = rotary(lib, dy, cos, sin, backward=True)
    assert not grad.isnan().any()
    assert rounded_relative_error(grad, expected_grad) <= BOUND
