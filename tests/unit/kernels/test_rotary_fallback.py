"""Rotary embedding on CPU (the PyTorch fallback) against a pair-by-pair rotation.

The plain version rotates each pair (j, j + rot_dim / 2) of the rotary dims by the angle
position * inv_freq[j] with an explicit 2x2 rotation in float64 (GPT-NeoX convention), and
leaves dims past rot_dim alone (rotary_pct < 1).
"""

from __future__ import annotations

import pytest
import torch

from megatron.kernels import apply_rotary, apply_rotary_pos_emb, reference_rotary
from megatron.kernels.rotary import rotary_unsupported_reason

SEQ, BATCH, HEADS, HEAD_DIM = 9, 2, 3, 16


def angle_tables(seq: int, rot_dim: int, dtype=torch.float32, base: float = 10000.0):
    """GPT-NeoX cos/sin tables (seq, 1, 1, rot_dim): cat(freqs, freqs) over the two halves."""
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def pairwise_rotation(x: torch.Tensor, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    out = x.double().clone()
    half = rot_dim // 2
    for j in range(half):
        theta = torch.arange(x.size(0), dtype=torch.float64) * base ** (-2 * j / rot_dim)
        c, s = theta.cos()[:, None, None], theta.sin()[:, None, None]
        a, b = x[..., j].double(), x[..., j + half].double()
        out[..., j] = a * c - b * s
        out[..., j + half] = b * c + a * s
    return out


@pytest.mark.parametrize("rotary_pct", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_rotation_matches_pairwise_rotation(rotary_pct, dtype, tolerance):
    rot_dim = int(HEAD_DIM * rotary_pct)
    x = torch.randn(SEQ, BATCH, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    x = x.to(dtype)
    cos, sin = angle_tables(SEQ, rot_dim, dtype)
    expected = pairwise_rotation(x, rot_dim)
    for out in (reference_rotary(x, cos, sin), apply_rotary(x, cos, sin, fused=True)):
        assert out.dtype == dtype and out.shape == x.shape
        error = (out.double() - expected).norm() / expected.norm()
        assert error < tolerance
        assert torch.equal(out[..., rot_dim:], x[..., rot_dim:])


def test_fp32_tables_keep_the_input_dtype():
    x = torch.randn(SEQ, BATCH, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    cos, sin = angle_tables(SEQ, HEAD_DIM, torch.float32)
    assert apply_rotary(x, cos, sin).dtype == torch.bfloat16


def test_gradient_is_the_inverse_rotation():
    """The rotation is orthogonal: its input gradient rotates the output gradient back."""
    x = torch.randn(SEQ, BATCH, HEADS, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    cos, sin = angle_tables(SEQ, 8, torch.float64)
    grad = torch.randn(SEQ, BATCH, HEADS, HEAD_DIM, dtype=torch.float64)
    (grad_x,) = torch.autograd.grad(apply_rotary(x, cos, sin), x, grad)
    torch.testing.assert_close(apply_rotary(grad_x, cos, sin), grad)
    small = x[:3, :1].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: reference_rotary(t, cos[:3], sin[:3]), (small,))


def test_strided_query_key_views_of_a_fused_projection():
    qkv = torch.randn(SEQ, BATCH, HEADS, 3 * HEAD_DIM)
    query, key, _ = qkv.split(HEAD_DIM, dim=-1)  # non-contiguous views
    cos, sin = angle_tables(SEQ, HEAD_DIM)
    q_out, k_out = apply_rotary_pos_emb(query, key, cos, sin)
    torch.testing.assert_close(q_out, reference_rotary(query.contiguous(), cos, sin))
    torch.testing.assert_close(k_out, reference_rotary(key.contiguous(), cos, sin))


def test_per_row_tables_rotate_each_row_by_its_own_positions():
    cos, sin = angle_tables(SEQ + 3, HEAD_DIM)
    x = torch.randn(SEQ, 2, HEADS, HEAD_DIM)
    # row 0 at positions 0.., row 1 at positions 3..: (seq, batch, 1, rot) tables
    per_row_cos = torch.cat((cos[:SEQ], cos[3:]), dim=1)
    per_row_sin = torch.cat((sin[:SEQ], sin[3:]), dim=1)
    out = apply_rotary(x, per_row_cos, per_row_sin)
    torch.testing.assert_close(out[:, :1], apply_rotary(x[:, :1], cos[:SEQ], sin[:SEQ]))
    torch.testing.assert_close(out[:, 1:], apply_rotary(x[:, 1:], cos[3:], sin[3:]))


def test_offset_uses_later_positions_of_the_table():
    cos, sin = angle_tables(SEQ + 4, HEAD_DIM)
    x = torch.randn(SEQ + 4, 1, HEADS, HEAD_DIM)
    full, _ = apply_rotary_pos_emb(x, x, cos, sin)
    tail, _ = apply_rotary_pos_emb(x[4:], x[4:], cos, sin, offset=4)
    torch.testing.assert_close(tail, full[4:])


def test_grouped_query_key_may_have_fewer_heads():
    cos, sin = angle_tables(SEQ, HEAD_DIM)
    q, k = torch.randn(SEQ, 1, 4, HEAD_DIM), torch.randn(SEQ, 1, 2, HEAD_DIM)
    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape


@pytest.mark.parametrize(
    "x_shape,rot_dim,offset,message",
    [
        ((SEQ, 1, 2, 16), 16, SEQ, "outside the cos/sin table"),
        ((SEQ, 1, 2, 16), 7, 0, "must be even"),
        ((SEQ, 1, 2, 16), 32, 0, "must be even and in"),
    ],
)
def test_bad_arguments_raise_errors_naming_the_problem(x_shape, rot_dim, offset, message):
    x = torch.randn(x_shape)
    cos = torch.ones(SEQ, 1, 1, rot_dim)
    with pytest.raises(ValueError, match=message):
        apply_rotary_pos_emb(x, x, cos, cos, offset)


def test_table_shape_and_seq_mismatch_are_rejected():
    x = torch.randn(SEQ, 1, 2, 16)
    with pytest.raises(ValueError, match="\\(seq, 1, 1, rot_dim\\)"):
        apply_rotary(x, torch.ones(SEQ, 16), torch.ones(SEQ, 16))
    with pytest.raises(ValueError, match="differ in seq"):
        apply_rotary_pos_emb(x, x[:3], torch.ones(SEQ, 1, 1, 16), torch.ones(SEQ, 1, 1, 16))


def test_kernel_path_refuses_cpu_tensors_with_a_reason():
    x = torch.randn(SEQ, 1, 2, 16)
    cos, sin = angle_tables(SEQ, 16)
    assert "cpu" in rotary_unsupported_reason(x, cos, sin)
