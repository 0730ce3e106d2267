"""T5's relative position bias (`pos_emb: rpe`), GPT-NeoX's causal form.

Each attention layer adds to its scores `bias[h, i, j] = sqrt(head_dim) * table[bucket(pos_i -
pos_j), h]`, where `table` is a learned `(rpe_num_buckets, heads)` matrix (Xavier-normal
initialised, as GPT-NeoX's `ParallelRelativePositionBias`) and the bucket of a distance `n >= 0`
(a key in the future has `n < 0` and counts as 0; it is masked anyway) is

    n                                                            if n < B/2
    min(B - 1, B/2 + floor(log(n / (B/2)) / log(M / (B/2)) * (B - B/2)))   otherwise

with `B = rpe_num_buckets`, `M = rpe_max_distance`: exact buckets for short distances,
logarithmic ones up to `M`, and one shared bucket beyond. This is T5's `_relative_position_bucket`
with `bidirectional=False`. The bias is an additive score bias like ALiBi's, so every attention
backend takes it (`megatron/model/attention_backends.py`); the key/value cache does not
(`megatron/inference/kv_cache.py`).

Two differences from GPT-NeoX, both about where the table lives: GPT-NeoX builds one table and
hands it to every layer, whose copies then train apart across pipeline stages; here each
attention layer owns its table (`attention.positions.weight`, split over tensor-parallel ranks
by heads), so a layer's parameters are its own at any pipeline layout. And distances come from
the batch's `position_ids`, as ALiBi's do, so documents packed with reset positions are
measured from their own start (equal to GPT-NeoX's `arange` positions otherwise).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model.args import ModelArgs
from megatron.model.attention_masks import PER_FORWARD, additive_mask
from megatron.parallel.params import sharded_parameter


def relative_position_bucket(
    distance: torch.Tensor, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """The causal T5 bucket (int64) of each `distance = pos_query - pos_key`."""
    n = distance.clamp(min=0)
    max_exact = num_buckets // 2
    # log(0) is -inf for n = 0; those entries take the exact branch below.
    spread = torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (spread * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(n < max_exact, n, large)


class RelativePositionBias(nn.Module):
    """Attention side of `pos_emb: rpe`: `encode(q, k, position_ids) -> (q, k, bias)` with
    bias `(b, heads/tp, sq, sk)` (this rank's heads) in the compute dtype, holding the causal
    and window mask (the attention backends' contract).

    The buckets depend on the positions alone: built once per forward
    (`attention_masks.PER_FORWARD`) as int32, the one copy every layer's embedding lookup
    keeps for its backward. The bias itself is this layer's (its own table).
    """

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__()
        self.num_buckets = args.rpe_num_buckets
        self.max_distance = args.rpe_max_distance
        self.scale = math.sqrt(args.head_dim)
        self.window = args.sliding_window_width
        shape = (args.rpe_num_buckets, args.num_attention_heads)
        self.weight = sharded_parameter(shape, 1, nn.init.xavier_normal_, tp_group)

    def buckets(self, position_ids: torch.Tensor) -> torch.Tensor:
        """`(b, sq, sk)` int32 buckets of `pos_q - pos_k`."""
        distance = position_ids.unsqueeze(2) - position_ids.unsqueeze(1)  # (b, sq, sk)
        return relative_position_bucket(distance, self.num_buckets, self.max_distance).int()

    def encode(self, q, k, position_ids):
        key = ("rpe buckets", self.num_buckets, self.max_distance, position_ids.device)
        buckets = PER_FORWARD.get(position_ids, key, lambda: self.buckets(position_ids))
        bias = F.embedding(buckets, self.weight * self.scale)  # (b, sq, sk, heads/tp)
        sq, sk = buckets.shape[-2:]
        mask = additive_mask(sq, sk, self.window, q.device, q.dtype)
        return q, k, bias.permute(0, 3, 1, 2).to(q.dtype) + mask
