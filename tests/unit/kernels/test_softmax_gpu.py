"""The fused softmax kernels against a float64 PyTorch reference, on a GPU.

Each check fills the output with NaN first (so an unwritten element shows), uses fresh random
inputs, and holds fp32/fp16/bf16 outputs to a relative error of 1e-3 (see gpu_support).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.kernels import AttnMaskType, FusedScaleMaskSoftmax
from megatron.kernels.softmax_cuda import MAX_COLUMNS
from megatron.kernels.softmax_reference import (
    reference_scaled_masked_softmax,
    reference_softmax_backward,
)
from tests.unit.kernels.gpu_support import BOUND, kernel_marks, rounded_relative_error

pytestmark = kernel_marks("softmax")
REPO = Path(__file__).resolve().parents[3]

SCALE = 0.125
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
SHAPES = [  # (b, np, sq, sk)
    (2, 3, 128, 128),
    (1, 2, 37, 37),  # odd sk: element-by-element path
    (2, 4, 1000, 1000),  # not a power of two, 16-byte vectors
    (1, 3, 333, 777),  # sq != sk
    (3, 1, 5, 3000),  # one block per row, partly empty vectors
    (1, 2, 2048, 2048),
]
LONG_SHAPES = [(1, 1, 16384, 16384), (1, 1, 48, 32768), (1, 2, 40, 16385)]
MASKS = ["causal", "causal+mask", "mask", "shared-mask", "key-mask", "none"]


def make_inputs(shape, dtype, kind, seed):
    """Scores of `shape` and the mask of `kind` (one of MASKS); returns (x, mask, causal)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    b, _, sq, sk = shape
    x = (4 * torch.randn(shape, device="cuda", generator=generator)).to(dtype)
    mask_shapes = {
        "mask": (b, 1, sq, sk),
        "causal+mask": (b, 1, sq, sk),
        "shared-mask": (1, 1, sq, sk),
        "key-mask": (b, 1, 1, sk),
    }
    mask = None
    if kind in mask_shapes:
        mask = torch.rand(mask_shapes[kind], device="cuda", generator=generator) < 0.2
        if mask.size(2) > 1:
            mask[0, 0, 0, :] = True  # a fully masked row
            mask[-1, 0, -1, : sk // 2] = True  # a half-masked row
        else:
            mask[0, 0, 0, ::3] = True  # every third key of batch entry 0
    return x, mask, kind.startswith("causal")


def check_forward_and_backward(x, mask, causal, seed=0):
    ops = torch.ops.megatron_fused_softmax
    expected = reference_scaled_masked_softmax(x.double(), mask, SCALE, causal=causal)
    out = torch.full_like(x, float("nan"))
    ops.forward(x, mask, SCALE, causal, out)
    assert not out.isnan().any(), "forward left elements unwritten (NaN) or produced NaN"
    assert rounded_relative_error(out, expected) <= BOUND

    y = expected.to(x.dtype)  # a softmax output in the kernel's dtype
    generator = torch.Generator(device="cuda").manual_seed(seed + 1)
    dy = torch.randn(x.shape, device="cuda", generator=generator).to(x.dtype)
    expected_grad = reference_softmax_backward(dy.double(), y.double(), SCALE)
    grad = torch.full_like(x, float("nan"))
    ops.backward(dy, y, SCALE, causal, grad)
    assert not grad.isnan().any(), "backward left elements unwritten (NaN) or produced NaN"
    assert rounded_relative_error(grad, expected_grad) <= BOUND
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", MASKS)
def test_kernels_match_fp64(dtype, shape, kind):
    x, mask, causal = make_inputs(shape, dtype, kind, seed=SHAPES.index(shape))
    out = check_forward_and_backward(x, mask, causal)
    if mask is not None and mask.size(2) > 1:
        assert torch.equal(out[0, :, 0], torch.zeros_like(out[0, :, 0]))  # fully masked row


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", LONG_SHAPES)
def test_long_rows(dtype, shape):
    x, mask, causal = make_inputs(shape, dtype, "causal" if shape[2] == shape[3] else "mask", 7)
    check_forward_and_backward(x, mask, causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_misaligned_tensors_use_the_elementwise_path(dtype):
    shape = (2, 2, 64, 64)
    numel = 2 * 2 * 64 * 64
    x = torch.randn(numel + 1, device="cuda", dtype=dtype)[1:].view(shape)  # off by 1 element
    check_forward_and_backward(x, None, True)


@pytest.mark.parametrize("mask_type", [AttnMaskType.causal, AttnMaskType.padding])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_module_gradients_as_good_as_eager(mask_type, dtype):
    """Through autograd, the fused path is no further from float64 than PyTorch eager is.

    Eager here is the PyTorch path in the input dtype (softmax_in_fp32=False), which like the
    kernel's backward works from the softmax output stored in that dtype.
    """
    x, mask, _ = make_inputs((2, 4, 256, 256), dtype, "mask", seed=3)
    mask = None if mask_type is AttnMaskType.causal else mask
    grad = torch.randn_like(x)
    fused = FusedScaleMaskSoftmax(mask_type, fusion=True, scale=SCALE)
    eager = FusedScaleMaskSoftmax(mask_type, fusion=False, softmax_in_fp32=False, scale=SCALE)
    assert fused.select(x, mask).name == "cuda"

    def output_and_grad(module, inputs):
        inputs = inputs.detach().requires_grad_()
        out = module(inputs, mask)
        return out, torch.autograd.grad(out, inputs, grad.to(inputs.dtype))[0]

    out64, grad64 = output_and_grad(eager, x.double())
    for fused_value, eager_value, exact in zip(
        output_and_grad(fused, x), output_and_grad(eager, x), (out64, grad64)
    ):
        fused_error = ((fused_value.double() - exact).norm() / exact.norm()).item()
        eager_error = ((eager_value.double() - exact).norm() / exact.norm()).item()
        assert fused_error <= 1.5 * eager_error + 1e-4


def test_rows_longer_than_the_limit_fall_back_to_torch():
    assert torch.ops.megatron_fused_softmax.max_columns() == MAX_COLUMNS
    x = torch.randn(1, 1, 2, MAX_COLUMNS + 1, device="cuda", dtype=torch.float16)
    assert FusedScaleMaskSoftmax(AttnMaskType.padding).select(x).name == "torch"


# Called directly with too long a row, the op must refuse with a RuntimeError. In its own
# process: on an H200 (torch 2.11, CUDA 13, the acceptance run of bench/gpu_check.py) this call
# crashed the process (SIGSEGV) instead, which took the rest of the GPU suite with it.
REFUSE_TOO_LONG = f"""
import torch, megatron.kernels._fused_softmax_cuda
x = torch.randn(1, 1, 2, {MAX_COLUMNS + 1}, device="cuda", dtype=torch.float16)
try:
    torch.ops.megatron_fused_softmax.forward(x, None, 1.0, False, torch.empty_like(x))
except RuntimeError as error:
    print("refused:", error)
"""


def test_a_row_longer_than_the_limit_is_refused_by_the_op():
    done = subprocess.run([sys.executable, "-c", REFUSE_TOO_LONG], cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-2000:]}"
    assert "refused:" in done.stdout and "limit" in done.stdout
