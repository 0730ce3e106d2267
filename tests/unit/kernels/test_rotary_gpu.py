"""The fused rotary kernel against a float64 PyTorch reference, on a GPU.

Outputs are filled with NaN first (so an unwritten element shows), inputs are fresh random
tensors, and fp32/fp16/bf16 results are held to a relative error of 1e-3 (see gpu_support).
"""

from __future__ import annotations

import pytest
import torch

from megatron.kernels import apply_rotary, reference_rotary
from megatron.kernels.rotary import rotary_unsupported_reason
from tests.unit.kernels.gpu_support import BOUND, kernel_marks, rounded_relative_error

pytestmark = kernel_marks("rotary")

SHAPES = [  # (seq, batch, heads, head_dim)
    (128, 2, 4, 64),
    (37, 3, 5, 80),  # nothing a power of two
    (1024, 2, 8, 128),
    (16384, 1, 2, 64),
]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def angle_tables(seq: int, rot_dim: int, dtype: torch.dtype, batch: int = 1):
    """(seq, batch, 1, rot_dim) cos/sin; with batch > 1, each row at its own random positions."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot_dim, 2, device="cuda").double() / rot_dim)
    if batch == 1:
        positions = torch.arange(seq, device="cuda").double()[:, None, None]
    else:
        positions = torch.randint(0, 4 * seq, (seq, batch, 1), device="cuda").double()
    emb = (positions[..., None] * inv_freq).repeat(1, 1, 1, 2)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def make_input(shape, dtype, strided: bool, seed: int) -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    seq, batch, heads, head_dim = shape
    if not strided:
        return torch.randn(shape, device="cuda", generator=generator).to(dtype)
    # the query of a fused QKV projection: (seq, batch, heads, 3 * head_dim) split on the last dim
    qkv = torch.randn(seq, batch, heads, 3 * head_dim, device="cuda", generator=generator)
    return qkv.to(dtype)[..., head_dim : 2 * head_dim]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_pct", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("tables", ["shared", "fp32", "per-row"])
@pytest.mark.parametrize("strided", [False, True])
def test_kernel_matches_fp64(shape, dtype, rotary_pct, tables, strided):
    rot_dim = int(shape[-1] * rotary_pct)
    x = make_input(shape, dtype, strided, seed=SHAPES.index(shape))
    table_dtype = torch.float32 if tables == "fp32" else dtype
    table_batch = shape[1] if tables == "per-row" else 1
    cos, sin = angle_tables(shape[0], rot_dim, table_dtype, table_batch)
    ops = torch.ops.megatron_fused_rotary

    x64 = x.double().requires_grad_()
    expected = reference_rotary(x64, cos.double(), sin.double())
    out = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    ops.forward(x, cos, sin, out)
    assert not out.isnan().any(), "forward left elements unwritten (NaN) or produced NaN"
    assert rounded_relative_error(out, expected.detach()) <= BOUND
    assert torch.equal(out[..., rot_dim:], x[..., rot_dim:])

    dy = make_input(shape, dtype, strided, seed=99)
    (expected_grad,) = torch.autograd.grad(expected, x64, dy.double())
    grad = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    ops.backward(dy, cos, sin, grad)
    assert not grad.isnan().any(), "backward left elements unwritten (NaN) or produced NaN"
    assert rounded_relative_error(grad, expected_grad) <= BOUND


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_apply_rotary_uses_the_kernel_through_autograd(dtype):
    shape = (256, 2, 4, 64)
    x = make_input(shape, dtype, strided=True, seed=5).requires_grad_()
    cos, sin = angle_tables(shape[0], 32, dtype)
    assert rotary_unsupported_reason(x, cos, sin) is None
    out = apply_rotary(x, cos, sin, fused=True)
    dy = torch.randn_like(out)
    (grad,) = torch.autograd.grad(out, x, dy)

    x64 = x.detach().double().requires_grad_()
    expected = reference_rotary(x64, cos.double(), sin.double())
    (expected_grad,) = torch.autograd.grad(expected, x64, dy.double())
    assert rounded_relative_error(out.detach(), expected.detach()) <= BOUND
    assert rounded_relative_error(grad, expected_grad) <= BOUND


def test_tables_that_require_grad_use_the_reference():
    x = torch.randn(8, 1, 2, 16, device="cuda")
    cos, sin = angle_tables(8, 16, torch.float32)
    assert "require grad" in rotary_unsupported_reason(x, cos.requires_grad_(), sin)
