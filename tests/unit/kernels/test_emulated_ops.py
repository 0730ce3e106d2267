"""The Python faces of the kernels driving the emulated kernels through `torch.ops`, on CPU.

The op schemas are read from csrc/*_binding.cpp and registered under their real namespaces
with CPU implementations that call the emulated kernels (emulated_kernels.py), and the kernel
path is told to accept CPU tensors. So `FusedScaleMaskSoftmax` and `apply_rotary_pos_emb`
run their fused branch end to end (dispatch, autograd functions, op calls against the real
schemas, the kernel code) and are compared with their PyTorch branch. Skipped where the
compiled extension already owns those namespaces (a GPU machine: the GPU tests cover it).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

from megatron.kernels import AttnMaskType, FusedScaleMaskSoftmax, apply_rotary_pos_emb, softmax_cuda
from megatron.kernels import rotary as rotary_module
from megatron.kernels.build import REPO_ROOT
from megatron.kernels.rotary_reference import reference_rotary

CALLS: Counter = Counter()


def binding_schemas(binding: str) -> list[str]:
    """The schemas passed to m.def(...) in a binding file (adjacent literals joined)."""
    text = (REPO_ROOT / "csrc" / binding).read_text()
    definitions = re.findall(r'm\.def\(\s*((?:"[^"]*"\s*)+)', text)
    return ["".join(re.findall(r'"([^"]*)"', d)) for d in definitions]


def _checked(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"emulated {what} returned cudaError {status}")


@pytest.fixture(scope="module")
def emulated_ops(emulated):
    libraries = []
    for namespace, binding in (
        ("megatron_fused_softmax", "fused_softmax_binding.cpp"),
        ("megatron_fused_rotary", "fused_rotary_binding.cpp"),
    ):
        try:
            library = torch.library.Library(namespace, "DEF")
            for schema in binding_schemas(binding):
                library.define(schema)
        except RuntimeError as error:
            pytest.skip(f"{namespace} is already registered (compiled extension?): {error}")
        libraries.append(library)
    softmax, rotary = libraries

    def softmax_forward(x, mask, scale, causal, out):
        CALLS["softmax.forward"] += 1
        _checked(emulated.softmax_forward(x, mask, scale, causal, out), "softmax forward")

    def softmax_backward(dy, y, scale, causal, grad):
        CALLS["softmax.backward"] += 1
        _checked(emulated.softmax_backward(dy, y, scale, causal, grad), "softmax backward")

    def rotary_forward(x, cos, sin, out):
        CALLS["rotary.forward"] += 1
        _checked(emulated.rotary(x, cos, sin, out, backward=False), "rotary forward")

    def rotary_backward(dy, cos, sin, grad):
        CALLS["rotary.backward"] += 1
        _checked(emulated.rotary(dy, cos, sin, grad, backward=True), "rotary backward")

    softmax.impl("forward", softmax_forward, "CPU")
    softmax.impl("backward", softmax_backward, "CPU")
    softmax.impl("max_columns", lambda: softmax_cuda.MAX_COLUMNS, "CompositeExplicitAutograd")
    rotary.impl("forward", rotary_forward, "CPU")
    rotary.impl("backward", rotary_backward, "CPU")
    with pytest.MonkeyPatch.context() as patch:
        for module in (softmax_cuda, rotary_module):
            patch.setattr(module, "KERNEL_DEVICE_TYPES", ("cuda", "cpu"))
            patch.setattr(module, "load_extension", lambda kernel: object())
        yield
    for library in libraries:
        library._destroy()


def test_schemas_are_found():
    assert [s.split("(")[0] for s in binding_schemas("fused_softmax_binding.cpp")] == [
        "forward",
        "backward",
        "max_columns",
    ]
    assert [s.split("(")[0] for s in binding_schemas("fused_rotary_binding.cpp")] == [
        "forward",
        "backward",
    ]


def relative_error(actual, exact):
    return ((actual.double() - exact).norm() / exact.norm()).item()


MASKS = [
    (AttnMaskType.causal, None),
    (AttnMaskType.causal, (2, 1, 12, 12)),
    (AttnMaskType.padding, (2, 1, 12, 12)),
    (AttnMaskType.padding, (2, 1, 1, 12)),
    (AttnMaskType.padding, None),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_type,mask_shape", MASKS)
def test_fused_softmax_module_matches_its_torch_path(emulated_ops, dtype, mask_type, mask_shape):
    generator = torch.Generator().manual_seed(0)
    # non-contiguous scores: a transposed view of (b, np, sk, sq)
    x = (3 * torch.randn(2, 3, 12, 12, generator=generator)).to(dtype).transpose(-1, -2)
    mask = None if mask_shape is None else torch.rand(mask_shape, generator=generator) < 0.3
    grad = torch.randn(2, 1, 12, 12, generator=generator).to(dtype).expand(2, 3, 12, 12)
    fused = FusedScaleMaskSoftmax(mask_type, fusion=True, scale=0.5)
    eager = FusedScaleMaskSoftmax(mask_type, fusion=False, softmax_in_fp32=False, scale=0.5)
    assert fused.select(x, mask).name == "cuda"

    def run(module, inputs):
        inputs = inputs.detach().requires_grad_()
        out = module(inputs, mask)
        return out, torch.autograd.grad(out, inputs, grad.to(inputs.dtype))[0]

    before = CALLS.copy()
    exact = run(eager, x.double())
    for fused_value, eager_value, exact_value in zip(run(fused, x), run(eager, x), exact):
        assert fused_value.dtype == dtype and not fused_value.isnan().any()
        error = relative_error(fused_value, exact_value)
        assert error <= 1.5 * relative_error(eager_value, exact_value) + 1e-6
    assert CALLS["softmax.forward"] == before["softmax.forward"] + 1
    assert CALLS["softmax.backward"] == before["softmax.backward"] + 1


@pytest.mark.parametrize("rotary_pct", [1.0, 0.5])
@pytest.mark.parametrize("table_batch", [1, 2])
def test_fused_rotary_matches_the_reference(emulated_ops, rotary_pct, table_batch):
    seq, batch, heads, head_dim = 6, 2, 3, 16
    rot_dim = int(head_dim * rotary_pct)
    qkv = torch.randn(seq, batch, heads, 3 * head_dim, dtype=torch.float64).float()
    query, key, _ = qkv.requires_grad_().split(head_dim, dim=-1)  # strided views
    angles = torch.rand(seq, table_batch, 1, rot_dim // 2).repeat(1, 1, 1, 2) * 6
    cos, sin = angles.cos(), angles.sin()

    before = CALLS.copy()
    q_out, k_out = apply_rotary_pos_emb(query, key, cos, sin, fused=True)
    grad_fused = torch.autograd.grad((q_out * 2 + k_out).sum(), qkv)[0]
    assert CALLS["rotary.forward"] == before["rotary.forward"] + 2
    assert CALLS["rotary.backward"] == before["rotary.backward"] + 2

    q_ref, k_ref = reference_rotary(query, cos, sin), reference_rotary(key, cos, sin)
    grad_ref = torch.autograd.grad((q_ref * 2 + k_ref).sum(), qkv)[0]
    torch.testing.assert_close(q_out, q_ref)
    torch.testing.assert_close(k_out, k_ref)
    torch.testing.assert_close(grad_fused, grad_ref)
