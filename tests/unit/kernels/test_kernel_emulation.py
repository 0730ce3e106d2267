"""The CUDA kernels of csrc/, run on the CPU by an emulation of CUDA threads.

The real kernel sources (.cu) are built for the CPU emulation (see emulated_kernels.py) and
called through ctypes on CPU tensors, with the checks of the GPU tests: outputs filled
with NaN first, a float64 reference, relative error <= 1e-3 after rounding the reference to
the output dtype. This proves indexing, layouts, masking, reductions and the launch dispatch
of the actual sources on a machine without a GPU; not the hardware memory model, nor speed.
"""

from __future__ import annotations

import pytest
import torch

from megatron.kernels.rotary_reference import reference_rotary
from megatron.kernels.softmax_reference import (
    reference_scaled_masked_softmax,
    reference_softmax_backward,
)
from tests.unit.kernels.gpu_support import BOUND, rounded_relative_error

SCALE = 0.3


def softmax_forward(emulated, x, mask, causal):
    out = torch.full_like(x, float("nan"))
    assert emulated.softmax_forward(x, mask, SCALE, causal, out) == 0
    return out


def softmax_backward(emulated, dy, y, causal):
    grad = torch.full_like(y, float("nan"))
    assert emulated.softmax_backward(dy, y, SCALE, causal, grad) == 0
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


def check_softmax(emulated, shape, dtype, kind, x=None):
    generator = torch.Generator().manual_seed(sum(shape))
    if x is None:
        x = (4 * torch.randn(shape, generator=generator)).to(dtype)
    mask = make_mask(kind, shape, generator)
    causal = kind.startswith("causal")
    expected = reference_scaled_masked_softmax(x.double(), mask, SCALE, causal=causal)
    out = softmax_forward(emulated, x, mask, causal)
    assert not out.isnan().any(), "forward left elements unwritten (NaN) or produced NaN"
    assert rounded_relative_error(out, expected) <= BOUND

    y = expected.to(dtype)
    dy = torch.randn(shape, generator=generator).to(dtype)
    grad = softmax_backward(emulated, dy, y, causal)
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
def test_softmax_kernels(emulated, shape, dtype, kind):
    check_softmax(emulated, shape, dtype, kind)


@pytest.mark.parametrize(
    "shape,dtype,kind",
    [
        ((1, 1, 3, 3001), torch.bfloat16, "causal+mask"),  # 256 threads a row, element-wise
        ((1, 1, 2, 16384), torch.float16, "mask"),  # 1024 threads x 16 elements
        ((1, 1, 2, 20000), torch.bfloat16, "key-mask"),  # 1024 threads x 32 elements
        ((1, 1, 2, 16385), torch.float32, "causal"),  # the same, element-wise
    ],
)
def test_softmax_long_rows(emulated, shape, dtype, kind):
    check_softmax(emulated, shape, dtype, kind)


def test_softmax_misaligned_tensors(emulated):
    shape = (1, 2, 6, 64)
    x = torch.randn(2 * 6 * 64 + 1).half()[1:].view(shape)  # 2 bytes off: element-wise path
    check_softmax(emulated, shape, torch.float16, "mask", x=x)


def test_softmax_rejects_rows_past_the_limit(emulated):
    x = torch.zeros(1, 1, 1, 32769, dtype=torch.float16)
    assert emulated.softmax_forward(x, None, 1.0, False, x) == 1  # cudaErrorInvalidValue


def rotary(emulated, x, cos, sin, backward):
    out = torch.full(x.shape, float("nan"), dtype=x.dtype)
    assert emulated.rotary(x, cos, sin, out, backward) == 0
    return out


def angle_tables(seq, batch, rot_dim, dtype, per_row, generator):
    """(seq, 1, 1, rot_dim) tables for positions 0..seq-1, or (seq, batch, 1, rot_dim) ones
    for random per-row positions."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot_dim, 2).double() / rot_dim)
    if per_row:
        positions = torch.randint(0, 4 * seq, (seq, batch, 1), generator=generator).double()
    else:
        positions = torch.arange(seq).double()[:, None, None]
    emb = (positions[..., None] * inv_freq).repeat(1, 1, 1, 2)  # (seq, batch or 1, 1, rot)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,rotary_pct", [((5, 2, 3, 16), 1.0), ((7, 3, 5, 80), 0.25)])
@pytest.mark.parametrize("tables", ["shared", "fp32", "per-row"])
@pytest.mark.parametrize("strided", [False, True])
def test_rotary_kernel(emulated, dtype, shape, rotary_pct, tables, strided):
    generator = torch.Generator().manual_seed(1)
    s, b, h, d = shape
    rot_dim = int(d * rotary_pct)
    table_dtype = torch.float32 if tables == "fp32" else dtype
    cos, sin = angle_tables(s, b, rot_dim, table_dtype, tables == "per-row", generator)
    x = torch.randn(s, b, h, 3 * d if strided else d, generator=generator).to(dtype)[..., :d]

    x64 = x.double().requires_grad_()
    expected = reference_rotary(x64, cos.double(), sin.double())
    out = rotary(emulated, x, cos, sin, backward=False)
    assert not out.isnan().any()
    assert rounded_relative_error(out, expected.detach()) <= BOUND

    dy = torch.randn(shape, generator=generator).to(dtype)
    (expected_grad,) = torch.autograd.grad(expected, x64, dy.double())
    grad = rotary(emulated, dy, cos, sin, backward=True)
    assert not grad.isnan().any()
    assert rounded_relative_error(grad, expected_grad) <= BOUND
