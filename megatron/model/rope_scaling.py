"""RoPE scaling rules: the inverse frequencies and cos/sin factor of each `rope_scaling` type.

Each rule follows the definition of Hugging Face transformers (`modeling_rope_utils`), field
for field (the fields and their checks: `megatron/config/groups/rope_scaling.py`). A rule turns the
rotary dims `dim`, the base and the batch's positions into `(inv_freq (dim/2,), attention
factor)`; `RotaryEmbedding` multiplies cos and sin by the factor, so the fused kernel and its
reference rotate with the same scaled tables.

`dynamic` depends on the sequence: while the largest position + 1 (`seq_len`) stays within
`max_position_embeddings` the frequencies are the unscaled ones; beyond, the base grows to
`base * (factor * seq_len / max_pos - (factor - 1)) ** (dim / (dim - 2))`, as transformers'
rotary module computes on each forward. With the key/value cache, every new token sees
`seq_len` = the sequence so far and the cached keys keep the rotation they were given, as in
transformers' generation. (Transformers' module also keeps the largest `seq_len` of earlier
calls until a call fits within the original length; here each call stands alone.)
"""

from __future__ import annotations

import math

import torch

from megatron.config.groups.rope_scaling import check_rope_scaling


def unscaled_inv_freq(base, dim: int, device) -> torch.Tensor:
    """`1 / base ** (2i / dim)` for i < dim/2, in fp32 (`base` a number or a 0-d tensor)."""
    exponent = torch.arange(0, dim, 2, device=device).float() / dim
    return 1.0 / (base**exponent)


class RopeRule:
    """No scaling; subclasses change the frequencies or the cos/sin factor."""

    def __init__(self, fields: dict, max_positions: int):
        self.fields, self.max_positions = dict(fields), max_positions

    def attention_factor(self) -> float:
        return 1.0

    def inv_freq(self, base: float, dim: int, position_ids: torch.Tensor) -> torch.Tensor:
        return unscaled_inv_freq(base, dim, position_ids.device)

    def longest(self) -> int:
        """The most positions generation may use."""
        return self.max_positions


class LinearRope(RopeRule):
    """Positions divided by `factor` (position interpolation)."""

    def inv_freq(self, base, dim, position_ids):
        return unscaled_inv_freq(base, dim, position_ids.device) / self.fields["factor"]


class DynamicNTKRope(RopeRule):
    """The base grows with the sequence once it passes `max_position_embeddings`."""

    def inv_freq(self, base, dim, position_ids):
        if dim <= 2:
            raise ValueError("rope_scaling dynamic needs more than 2 rotary dims (dim / (dim - 2))")
        factor, original = self.fields["factor"], self.max_positions
        seq_len = position_ids.max() + 1  # a tensor: no device sync
        # fp32 like transformers' update, which works on a tensor seq_len.
        growth = factor * seq_len.float() / original - (factor - 1)
        grown = base * growth ** (dim / (dim - 2))
        scaled = unscaled_inv_freq(grown, dim, position_ids.device)
        return torch.where(seq_len > original, scaled, unscaled_inv_freq(base, dim, scaled.device))

    def longest(self) -> int:
        # Transformers sets no bound; the rule is meant for up to factor x the original.
        return int(self.max_positions * self.fields["factor"])


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class YarnRope(RopeRule):
    """YaRN: interpolated (÷ factor) low frequencies, original high ones, a linear ramp
    between the dims completing `beta_slow` and `beta_fast` turns over the original length,
    and cos/sin multiplied by the attention factor."""

    def attention_factor(self):
        f = self.fields
        if f.get("attention_factor") is not None:
            return float(f["attention_factor"])
        if f.get("mscale") and f.get("mscale_all_dim"):
            return _yarn_mscale(f["factor"], f["mscale"]) / _yarn_mscale(
                f["factor"], f["mscale_all_dim"]
            )
        return _yarn_mscale(f["factor"])

    def _ramp_bounds(self, base: float, dim: int) -> tuple[float, float]:
        original = self.fields["original_max_position_embeddings"]

        def dim_of(turns):  # the (fractional) dim index whose wave turns `turns` times
            return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

        low = dim_of(self.fields.get("beta_fast") or 32)
        high = dim_of(self.fields.get("beta_slow") or 1)
        if self.fields.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def inv_freq(self, base, dim, position_ids):
        kept = unscaled_inv_freq(base, dim, position_ids.device)
        low, high = self._ramp_bounds(base, dim)
        if low == high:
            high += 0.001  # no zero-width ramp
        index = torch.arange(dim // 2, dtype=torch.float32, device=kept.device)
        interpolated_share = ((index - low) / (high - low)).clamp(0, 1)
        return (kept / self.fields["factor"]) * interpolated_share + kept * (1 - interpolated_share)


class Llama3Rope(RopeRule):
    """Llama 3.1: wavelengths above original/low_freq_factor divided by `factor`, those below
    original/high_freq_factor kept, a smooth blend between."""

    def inv_freq(self, base, dim, position_ids):
        f = self.fields
        kept = unscaled_inv_freq(base, dim, position_ids.device)
        factor, low, high = f["factor"], f["low_freq_factor"], f["high_freq_factor"]
        original = f["original_max_position_embeddings"]
        wavelength = 2 * math.pi / kept
        smooth = (original / wavelength - low) / (high - low)
        blended = (1 - smooth) * kept / factor + smooth * kept
        out = torch.where(wavelength > original / low, kept / factor, kept)
        middle = (wavelength >= original / high) & (wavelength <= original / low)
        return torch.where(middle, blended, out)


ROPE_RULES: dict[str, type[RopeRule]] = {
    "linear": LinearRope,
    "dynamic": DynamicNTKRope,
    "yarn": YarnRope,
    "llama3": Llama3Rope,
}


def rope_rule(args) -> RopeRule:
    """The scaling rule of `args.rope_scaling` (a no-op rule when null); refuses bad fields."""
    check_rope_scaling(args.rope_scaling, args.pos_emb)
    if args.rope_scaling is None:
        return RopeRule({}, args.max_positions)
    return ROPE_RULES[args.rope_scaling["rope_type"]](args.rope_scaling, args.max_positions)


def position_limit(args) -> int:
    """How many positions generation may fill (beyond `max_positions` only for `dynamic`)."""
    if args.pos_emb != "rotary" or args.rope_scaling is None:
        return args.max_positions
    return rope_rule(args).longest()
