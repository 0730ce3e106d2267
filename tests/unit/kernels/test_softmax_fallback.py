"""FusedScaleMaskSoftmax on CPU (the PyTorch fallback) against a plain softmax(scale * x masked).

The plain version below is written independently of `softmax_reference`: float64, masked
scores at -inf, an explicit exp/sum, and fully masked rows set to zero by hand.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron.kernels import AttnMaskType, FusedScaleMaskSoftmax
from megatron.kernels.softmax_cuda import fused_scaled_masked_softmax, unsupported_reason
from megatron.kernels.softmax_reference import (
    reference_scaled_masked_softmax,
    reference_softmax_backward,
)

B, NP, SQ, SK = 2, 3, 7, 7
SCALE = 0.37


def plain_softmax(x: torch.Tensor, mask: torch.Tensor | None, scale: float, causal: bool):
    """float64 softmax(scale * x) with True-masked positions at 0 and fully masked rows at 0."""
    s = x.double() * scale
    full = torch.zeros(s.shape, dtype=torch.bool)
    if mask is not None:
        full = full | mask
    if causal:
        rows = torch.arange(s.size(-2))[:, None]
        cols = torch.arange(s.size(-1))[None, :]
        full = full | (cols > rows)
    s = s.masked_fill(full, float("-inf"))
    row_max = s.amax(dim=-1, keepdim=True).clamp(min=-1e300)  # -inf rows: avoid inf - inf
    e = torch.exp(s - row_max)
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp(min=1e-300), torch.zeros_like(e))


def make_mask(kind: str, generator: torch.Generator) -> torch.Tensor | None:
    shapes = {
        "none": None,
        "batch": (B, 1, SQ, SK),
        "shared": (1, 1, SQ, SK),
        "keys": (B, 1, 1, SK),
    }
    shape = shapes[kind]
    if shape is None:
        return None
    mask = torch.rand(shape, generator=generator) < 0.3
    if kind == "batch":
        mask[0, 0, 2, :] = True  # one fully masked row
    return mask


CASES = [
    (AttnMaskType.causal, "none"),
    (AttnMaskType.causal, "batch"),
    (AttnMaskType.padding, "none"),
    (AttnMaskType.padding, "batch"),
    (AttnMaskType.padding, "shared"),
    (AttnMaskType.padding, "keys"),
]
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).norm() / expected.norm().clamp(min=1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_type,mask_kind", CASES)
@pytest.mark.parametrize("softmax_in_fp32", [True, False])
def test_forward_and_grad_match_plain_softmax(dtype, mask_type, mask_kind, softmax_in_fp32):
    generator = torch.Generator().manual_seed(CASES.index((mask_type, mask_kind)))
    x = (3 * torch.randn(B, NP, SQ, SK, generator=generator)).to(dtype).requires_grad_()
    mask = make_mask(mask_kind, generator)
    grad = torch.randn(B, NP, SQ, SK, generator=generator).to(dtype)
    softmax = FusedScaleMaskSoftmax(mask_type, True, softmax_in_fp32, SCALE)
    assert softmax.select(x, mask).name == "torch"  # CPU: the fallback

    out = softmax(x, mask)
    (grad_x,) = torch.autograd.grad(out, x, grad)

    x64 = x.detach().double().requires_grad_()
    expected = plain_softmax(x64, mask, SCALE, mask_type is AttnMaskType.causal)
    (expected_grad,) = torch.autograd.grad(expected, x64, grad.double())
    assert out.dtype == dtype and grad_x.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(grad_x).all()
    assert relative_error(out, expected) < TOLERANCES[dtype]
    assert relative_error(grad_x, expected_grad) < TOLERANCES[dtype]


def test_fully_masked_row_is_zero_with_zero_grad():
    x = torch.randn(1, 2, 3, 4, requires_grad=True)
    mask = torch.zeros(1, 1, 3, 4, dtype=torch.bool)
    mask[0, 0, 1] = True
    out = FusedScaleMaskSoftmax(AttnMaskType.padding)(x, mask)
    out.backward(torch.randn_like(out))
    assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 4))
    assert torch.equal(x.grad[:, :, 1], torch.zeros(1, 2, 4))
    assert torch.allclose(out[:, :, [0, 2]].sum(-1), torch.ones(1, 2, 2))


def test_causal_combines_with_explicit_mask():
    x = torch.randn(1, 1, 4, 4)
    mask = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 0] = True  # hide key 0 from every query: query 0 has nothing left
    out = FusedScaleMaskSoftmax(AttnMaskType.causal)(x, mask)
    assert torch.equal(out[0, 0, 0], torch.zeros(4))
    assert torch.equal(out[0, 0, 1], torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert torch.equal(out.triu(1), torch.zeros_like(out))


def test_backward_formula_matches_autograd():
    """The formula the GPU tests use to check the kernel's backward on a given output."""
    x = torch.randn(2, 2, 5, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 1, 5, 6) < 0.3
    y = reference_scaled_masked_softmax(x, mask, SCALE)
    dy = torch.randn_like(y)
    (expected,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(reference_softmax_backward(dy, y.detach(), SCALE), expected)


def test_fusion_off_has_only_the_torch_implementation():
    softmax = FusedScaleMaskSoftmax(AttnMaskType.padding, fusion=False)
    assert [impl.name for impl in softmax.implementations] == ["torch"]
    assert [impl.name for impl in FusedScaleMaskSoftmax().implementations] == ["cuda", "torch"]


def test_kernel_path_refuses_cpu_tensors_with_a_reason():
    x = torch.randn(1, 1, 4, 4)
    assert "cpu" in unsupported_reason(x)
    with pytest.raises(ValueError, match="fused softmax cannot run"):
        fused_scaled_masked_softmax(x)


@pytest.mark.parametrize(
    "scores,mask,message",
    [
        (torch.randn(3, 4, 4), None, "must be \\(b, np, sq, sk\\)"),
        (torch.randn(1, 1, 4, 4), torch.zeros(1, 1, 3, 4, dtype=torch.bool), "does not broadcast"),
        (torch.randn(1, 1, 4, 4), torch.zeros(2, 1, 4, 4, dtype=torch.bool), "does not broadcast"),
        (torch.randn(1, 1, 4, 4), torch.zeros(1, 1, 4, 4), "must be bool"),
    ],
)
def test_bad_inputs_raise_errors_naming_the_problem(scores, mask, message):
    with pytest.raises(ValueError, match=message):
        FusedScaleMaskSoftmax(AttnMaskType.padding)(scores, mask)


def test_bad_mask_type_is_rejected():
    with pytest.raises(ValueError, match="mask_type"):
        FusedScaleMaskSoftmax("causal")


@pytest.mark.parametrize(
    "mask_type,fused", [(AttnMaskType.causal, True), (AttnMaskType.padding, False)]
)
def test_from_config_reads_the_fusion_key_of_the_mask_type(mask_type, fused):
    model = SimpleNamespace(
        scaled_upper_triang_masked_softmax_fusion=True,
        scaled_masked_softmax_fusion=False,
        attention_softmax_in_fp32=False,
    )
    softmax = FusedScaleMaskSoftmax.from_config(SimpleNamespace(model=model), mask_type, 0.5)
    assert ("cuda" in [impl.name for impl in softmax.implementations]) is fused
    assert softmax.scale == 0.5 and softmax.softmax_in_fp32 is False
    assert softmax.mask_type is mask_type
