"""Positional encodings, chosen by the `pos_emb` key.

Two places can use positions, so each encoding is split into (at most) two parts:

- input side, added to the token embeddings: `learned` (a trained table) and `sinusoidal`;
- attention side, applied to queries/keys or to the scores: `rotary` (rotates the first
  `rotary_pct` of each head's dims, GPT-NeoX `rotate_half` convention, via
  `megatron.kernels.apply_rotary_pos_emb`; `rope_scaling` rescales its frequencies,
  `megatron/model/rope_scaling.py`), `alibi` (a per-head linear bias on the scores) and `rpe`
  (T5's learned bucketed bias, `megatron/model/relative_bias.py`).

`none` uses neither. Every attention-side class implements one method,
`encode(q, k, position_ids) -> (q, k, score_bias)`, where `score_bias` is None or an additive
bias broadcastable to the scores `(b, heads/tp, sq, sk)` in the compute dtype (q's), holding the
causal and window mask (the attention backends' contract, `attention_backends.py`). Positions
come from the batch's `position_ids` `(b, s)`, so documents packed with reset positions are
encoded correctly.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from megatron.kernels import apply_rotary_pos_emb, reference_rotary
from megatron.model.args import ModelArgs, choose
from megatron.model.attention_masks import PER_FORWARD, blocked_keys
from megatron.model.init_methods import input_init
from megatron.model.relative_bias import RelativePositionBias
from megatron.model.rope_scaling import rope_rule
from megatron.parallel.comm import group_rank, group_size


class LearnedPositionEmbedding(nn.Embedding):
    """A trained `(max_positions, h)` table, replicated on every tensor-parallel rank."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.max_positions, args.hidden_size)
        input_init(args)(self.weight.data)


class SinusoidalPositionEmbedding(nn.Module):
    """The fixed `[sin(p w), cos(p w)]` encoding of "Attention is all you need" (no weights)."""

    def __init__(self, args: ModelArgs, base: float = 10000.0):
        super().__init__()
        self.dim, self.base = args.hidden_size, base

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        inv_freq = 1.0 / (
            self.base
            ** (torch.arange(0, self.dim, 2, device=position_ids.device).float() / self.dim)
        )
        angles = position_ids.float().unsqueeze(-1) * inv_freq  # (b, s, h/2)
        return torch.cat((angles.sin(), angles.cos()), dim=-1)  # (b, s, h)


class NoAttentionPositions(nn.Module):
    """Attention side of `learned`, `sinusoidal` and `none`: leaves q and k as they are."""

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__()

    def encode(self, q, k, position_ids):
        return q, k, None


class RotaryEmbedding(NoAttentionPositions):
    """Rotary position embedding on the first `rotary_pct` of each head's dims.

    Angles are computed in fp32 from `position_ids` once per forward and shared by the layers
    (`attention_masks.PER_FORWARD`; the inverse frequencies are a few dozen numbers, so no
    buffer exists for a bf16/fp16 cast to degrade). With
    `rope_fusion`, every batch goes through the kernel package's fused path with one table
    per row (packed documents with reset positions included); otherwise through its PyTorch
    reference.
    """

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__(args, tp_group)
        self.rot_dim = int(args.head_dim * args.rotary_pct)
        if self.rot_dim < 2 or self.rot_dim % 2:
            raise ValueError(
                f"rotary_pct {args.rotary_pct} of head dim {args.head_dim} gives {self.rot_dim} "
                "rotary dims; it must be an even number >= 2"
            )
        self.base = float(args.rotary_emb_base)
        self.fused = args.rope_fusion
        self.scaling = rope_rule(args)  # `rope_scaling`: frequencies and a cos/sin factor
        # what the angles depend on besides the positions (the layers sharing them agree)
        rule = (type(self.scaling).__name__, repr(sorted(self.scaling.fields.items())))
        self.key = ("rotary", self.rot_dim, self.base, *rule, self.scaling.max_positions)

    def cos_sin(self, position_ids: torch.Tensor):
        """fp32 `cos, sin` of shape `(s, b, 1, rot_dim)` for `position_ids` `(b, s)`."""
        inv_freq = self.scaling.inv_freq(self.base, self.rot_dim, position_ids)  # (rot/2,)
        angles = position_ids.float().unsqueeze(-1) * inv_freq  # (b, s, rot/2)
        emb = torch.cat((angles, angles), dim=-1).transpose(0, 1).unsqueeze(2)  # (s, b, 1, rot)
        factor = self.scaling.attention_factor()  # YaRN's; 1 for the other rules
        if factor != 1.0:
            return emb.cos() * factor, emb.sin() * factor
        return emb.cos(), emb.sin()

    def encode(self, q, k, position_ids):
        # q (s, b, nq, d), k (s, b, nkv, d)
        # once per forward, shared by the layers (14 small kernels each, before)
        key = (*self.key, position_ids.device)
        cos, sin = PER_FORWARD.get(position_ids, key, lambda: self.cos_sin(position_ids))
        # The fused kernel reads a table per batch row, so it needs no look at the positions
        # (asking whether the rows agree would cost a device sync per layer).
        if self.fused:
            q, k = apply_rotary_pos_emb(q, k, cos, sin, fused=True)
            return q, k, None
        return reference_rotary(q, cos, sin), reference_rotary(k, cos, sin), None


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi's per-head slopes: a geometric sequence, interleaved for non-powers of two."""
    closest = 2 ** math.floor(math.log2(num_heads))
    start = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [start ** (i + 1) for i in range(closest)]
    if closest < num_heads:
        slopes += alibi_slopes(2 * closest)[0::2][: num_heads - closest]
    return slopes


class AlibiBias(NoAttentionPositions):
    """ALiBi: adds `slope_h * (pos_k - pos_q)` (<= 0 where attention is allowed) to scores.

    Each tensor-parallel rank keeps the slopes of its own heads. The bias is built once per
    forward (`attention_masks.PER_FORWARD`, shared by the layers) in the compute dtype, with the
    causal and window mask in it (the backends' contract): `(rows, heads/tp, s, s)` with the
    rows of `position_ids`, so one row of positions for a batch whose rows agree gives a bias
    broadcast over the batch. Rows that may differ (documents packed with reset positions) keep
    theirs: telling that they agree would read the device.
    """

    def __init__(self, args: ModelArgs, tp_group=None):
        super().__init__(args, tp_group)
        local = args.num_attention_heads // group_size(tp_group)
        first = group_rank(tp_group) * local
        slopes = torch.tensor(alibi_slopes(args.num_attention_heads)[first : first + local])
        self.register_buffer("slopes", slopes, persistent=False)
        self.window = args.sliding_window_width
        self.key = ("alibi", args.num_attention_heads, first, local, self.window)

    def encode(self, q, k, position_ids):
        key = (*self.key, q.dtype, q.device)
        bias = PER_FORWARD.get(position_ids, key, lambda: self.bias(position_ids, q.dtype))
        return q, k, bias

    def bias(self, position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`(rows, heads/tp, s, s)` in `dtype`: the product in fp32, rounded once."""
        pos = position_ids.float()
        distance = (pos.unsqueeze(1) - pos.unsqueeze(2)).unsqueeze(1)  # (b, 1, sq, sk)
        rows, _, sq, sk = distance.shape
        bias = torch.empty(rows, len(self.slopes), sq, sk, dtype=dtype, device=pos.device)
        torch.mul(self.slopes.float().view(1, -1, 1, 1), distance, out=bias)
        blocked = blocked_keys(sq, sk, self.window, pos.device)
        return bias.masked_fill_(blocked, torch.finfo(dtype).min)


# pos_emb -> (input-side class or None, attention-side class, each with `encode`)
POSITIONAL_ENCODINGS: dict[str, tuple[type[nn.Module] | None, type[nn.Module]]] = {
    "learned": (LearnedPositionEmbedding, NoAttentionPositions),
    "sinusoidal": (SinusoidalPositionEmbedding, NoAttentionPositions),
    "rotary": (None, RotaryEmbedding),
    "alibi": (None, AlibiBias),
    "rpe": (None, RelativePositionBias),  # T5's, megatron/model/relative_bias.py
    "none": (None, NoAttentionPositions),
}


def build_input_positions(args: ModelArgs) -> nn.Module | None:
    """The input-side encoding (added to token embeddings), or None."""
    cls, _ = choose(POSITIONAL_ENCODINGS, "pos_emb", args.pos_emb)
    return cls(args) if cls is not None else None


def build_attention_positions(args: ModelArgs, tp_group=None) -> nn.Module:
    """The attention-side encoding (identity for input-side or no encodings)."""
    _, cls = choose(POSITIONAL_ENCODINGS, "pos_emb", args.pos_emb)
    return cls(args, tp_group)
