"""RoPE scaling through the fused rotary kernel (its CPU emulation, driven through `torch.ops`).

`RotaryEmbedding` with `rope_fusion` hands the scaled cos/sin (YaRN's attention factor
included) to the kernel; the rotated queries and keys must equal a rotation by transformers'
own cos/sin, beyond the original length. (The GPU tests cover the compiled kernel.)
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.kernels.rotary_reference import reference_rotary  # noqa: E402
from megatron.model.positional import RotaryEmbedding  # noqa: E402
from tests.unit.kernels.test_emulated_ops import CALLS, emulated_ops  # noqa: E402, F401
from tests.unit.model.test_hf_parity import neox_args  # noqa: E402
from tests.unit.model.test_rope_scaling import LONG, hf_rotary, scaled  # noqa: E402


@pytest.mark.usefixtures("emulated_ops")
@pytest.mark.parametrize("rule", ["yarn_mscale", "llama3", "dynamic"])
def test_scaled_tables_go_through_the_kernel(rule):
    args = dataclasses.replace(scaled(neox_args(0.5, True), rule), rope_fusion=True)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(LONG, 2, args.num_attention_heads, args.head_dim, generator=gen)
    k = torch.randn(LONG, 2, args.num_attention_heads, args.head_dim, generator=gen)
    positions = torch.arange(LONG).expand(2, LONG)
    before = CALLS["rotary.forward"]
    q_out, k_out, _ = RotaryEmbedding(args).encode(q, k, positions)
    assert CALLS["rotary.forward"] == before + 2  # the kernel, not the reference, rotated
    hf_cos, hf_sin = hf_rotary("gpt_neox", args)(q, positions)  # (b, s, rot)
    cos, sin = (t[0][:, None, None] for t in (hf_cos, hf_sin))  # (s, 1, 1, rot)
    torch.testing.assert_close(q_out, reference_rotary(q, cos, sin), rtol=0, atol=1e-5)
    torch.testing.assert_close(k_out, reference_rotary(k, cos, sin), rtol=0, atol=1e-5)
