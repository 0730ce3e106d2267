"""T5's relative position bias (`pos_emb: rpe`): buckets against `transformers`' T5 function,
and the bias GPT-NeoX adds (`sqrt(head_dim) * table[bucket, head]` on the scaled scores) in
every attention backend, with query-key layer scaling in GPT-NeoX's order (its
`ParallelSelfAttention.attention`: the scores divided by `sqrt(d) · coeff`, the bias added,
then its softmax multiplies everything by `coeff`, the bias too)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from megatron.model import ModelArgs
from megatron.model.attention_backends import ATTENTION_BACKENDS
from megatron.model.relative_bias import RelativePositionBias, relative_position_bucket


@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (8, 20), (7, 9), (2, 5)])
def test_buckets_are_t5s_causal_buckets(buckets, max_distance):
    q = torch.arange(300)[:, None]
    k = torch.arange(300)[None, :]
    ours = relative_position_bucket(q - k, buckets, max_distance)
    # T5 takes memory - query; bidirectional=False is the decoder's (causal) form.
    t5 = T5Attention._relative_position_bucket(
        k - q, bidirectional=False, num_buckets=buckets, max_distance=max_distance
    )
    assert torch.equal(ours, t5)
    assert ours.max() == buckets - 1 and ours.min() == 0


def _args(**kw) -> ModelArgs:
    values = dict(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=4,
        vocab_size=16,
        seq_length=12,
        pos_emb="rpe",
        rpe_num_buckets=6,
        rpe_max_distance=9,
    )
    return ModelArgs(**{**values, **kw})


def _expected(q, k, v, table, args, position_ids, coeff):
    """GPT-NeoX's attention with its rpe bias, causal, by loops:
    softmax(coeff · (q.k / (sqrt(d) · coeff) + sqrt(d) table[T5 bucket(k - q), head])) v."""
    s, b, n, d = q.shape
    out = torch.zeros_like(q)
    for bi in range(b):
        pos = position_ids[bi]
        for h in range(n):
            for i in range(s):
                rel = pos[: i + 1] - pos[i]  # key - query, for the keys query i sees
                bucket = T5Attention._relative_position_bucket(
                    rel, False, args.rpe_num_buckets, args.rpe_max_distance
                )
                scores = (k[: i + 1, bi, h] @ q[i, bi, h]) / (math.sqrt(d) * coeff)
                scores = scores + math.sqrt(d) * table[bucket, h]
                out[i, bi, h] = torch.softmax(coeff * scores, 0) @ v[: i + 1, bi, h]
    return out


@pytest.mark.parametrize("kind", sorted(ATTENTION_BACKENDS))
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
def test_every_backend_adds_gpt_neoxs_bias(kind, fused, scaled):
    torch.manual_seed(0)
    args = _args(
        layer_attention_types=(kind,), softmax_fusion=fused, apply_query_key_layer_scaling=scaled
    )
    rpe = RelativePositionBias(args)
    layer_number = 3
    backend = ATTENTION_BACKENDS[kind][fused](args, layer_number)
    s, b = 12, 2
    q, k, v = (torch.randn(s, b, 4, 4, dtype=torch.float64) for _ in range(3))
    position_ids = torch.stack([torch.arange(s), torch.arange(s) % 5])  # a packed second row
    table = rpe.weight.double()
    _, _, bias = rpe.encode(q, k, position_ids)
    assert bias.shape == (b, 4, s, s)
    out = backend(q, k, v, bias.double())
    coeff = layer_number if scaled else 1
    torch.testing.assert_close(out, _expected(q, k, v, table, args, position_ids, coeff))
