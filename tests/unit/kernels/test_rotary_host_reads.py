"""`rope_fusion` decides without looking at the positions: no host read per layer.

The fused kernel takes a cos/sin table per batch row, so rows with their own positions (packed
documents with reset positions) go through it as they are; the rotation must equal GPT-NeoX's
`rotate_half` formula written here, for rows that agree and rows that do not.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron.model.positional import RotaryEmbedding
from tests.device_costs import HostReads
from tests.unit.kernels.test_emulated_ops import CALLS, emulated_ops  # noqa: F401
from tests.unit.model.test_hf_parity import neox_args

SEQ, BATCH = 12, 3


def neox_rotation(x, position_ids, rot_dim, base=10000.0):
    """GPT-NeoX's rotary: x (s, b, n, d) rotated by its rows' positions (b, s), first rot_dim."""
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2).float() / rot_dim)  # (rot/2,)
    angles = position_ids.float()[..., None] * inv_freq  # (b, s, rot/2)
    emb = torch.cat((angles, angles), dim=-1).transpose(0, 1)[:, :, None]  # (s, b, 1, rot)
    x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    half = rot_dim // 2
    rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    return torch.cat((x_rot * emb.cos() + rotated * emb.sin(), x_pass), dim=-1)


def positions(kind: str) -> torch.Tensor:
    """(b, s) positions: every row the same, or rows of packed documents with resets."""
    if kind == "shared":
        return torch.arange(SEQ).expand(BATCH, SEQ)
    return torch.stack([torch.arange(SEQ) % (4 + row) for row in range(BATCH)])


def encode(position_ids):
    args = dataclasses.replace(neox_args(0.5, True), rope_fusion=True)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(SEQ, BATCH, args.num_attention_heads, args.head_dim, generator=gen)
    k = torch.randn(SEQ, BATCH, args.num_attention_heads, args.head_dim, generator=gen)
    rotary = RotaryEmbedding(args)
    with HostReads() as reads:
        q_out, k_out, _ = rotary.encode(q, k, position_ids)
    return reads, rotary.rot_dim, (q, k), (q_out, k_out)


@pytest.mark.parametrize("kind", ["shared", "per_row"])
def test_rope_fusion_reads_nothing_back(kind):
    reads, *_ = encode(positions(kind))
    assert reads.count == 0, reads.report()


@pytest.mark.usefixtures("emulated_ops")
@pytest.mark.parametrize("kind", ["shared", "per_row"])
def test_the_kernel_rotates_every_batch_as_neox_does(kind):
    position_ids = positions(kind)
    before = CALLS["rotary.forward"]
    _, rot_dim, inputs, outputs = encode(position_ids)
    assert CALLS["rotary.forward"] == before + 2  # the kernel, not the reference, rotated
    for x, out in zip(inputs, outputs):
        expected = neox_rotation(x, position_ids, rot_dim)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
