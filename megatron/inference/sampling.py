"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p.

`temperature == 0` is greedy (`argmax`, the first index on ties, as `transformers` does).
Otherwise the logits are divided by the temperature, filtered to the `top_k` most likely tokens
and to the smallest set whose probability reaches `top_p` (both optional, 0 disables), and one
token is drawn from the softmax with the given generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingSettings:
    """How tokens are chosen and when generation stops."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 0.0
    maximum_tokens: int = 64
    recompute: bool = False
    eod: int | None = None
    """Token that ends a sample (None: only `maximum_tokens` ends it)."""

    def __post_init__(self):
        for key, value, valid in (
            ("temperature", self.temperature, self.temperature >= 0),
            ("top_k", self.top_k, self.top_k >= 0),
            ("top_p", self.top_p, 0 <= self.top_p <= 1),
            ("maximum_tokens", self.maximum_tokens, self.maximum_tokens >= 1),
        ):
            if not valid:
                raise ValueError(
                    f"{key} = {value} is not valid: temperature >= 0, top_k >= 0, "
                    "0 <= top_p <= 1, maximum_tokens >= 1"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_config(cls, generation_cfg, eod: int | None) -> SamplingSettings:
        g = generation_cfg
        return cls(g.temperature, g.top_k, g.top_p, g.maximum_tokens, g.recompute, eod)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 0.0) -> torch.Tensor:
    """`(b, V)` logits with everything outside top-k / the top-p nucleus set to -inf."""
    logits = logits.clone()
    if top_k > 0:
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (b, 1)
        logits[logits < kth] = float("-inf")
    if 0 < top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the tokens before it already reach top_p (the first always stays)
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits[drop] = float("-inf")
    return logits


def sample(
    logits: torch.Tensor, settings: SamplingSettings, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The next token of each row of `(b, V)` logits: `(b,)` int64."""
    if settings.greedy:
        return logits.argmax(dim=-1)
    scaled = filter_logits(logits.float() / settings.temperature, settings.top_k, settings.top_p)
    probs = scaled.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
