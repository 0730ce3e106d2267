"""Mixture-of-experts routing: routers, expert capacity, token dropping and the router losses.

A router maps this rank's tokens `(T, h)` to `Route`: for each token its `k` experts
(`indices`, int64 `(T, k)`) and their weights (`(T, k)`), with the router logits and the
softmax probabilities over all experts that the losses read. Routers (`ROUTERS`):

- `topk` (token choice): `probs = softmax(logits)`, the k most probable experts; weights per
  `moe_router_weights`: `softmax` (GPT-NeoX, Switch: the probabilities as they are),
  `softmax_renormalized` (Mixtral: divided by their sum over the k) or `topk_softmax`
  (softmax over the k logits; the same values). With `moe_jitter_eps` the router input is
  multiplied by uniform noise in `[1 - eps, 1 + eps]` in training (GPT-NeoX).
- `sinkhorn` (Megatron, GPT-NeoX's default): in training the experts are the top-k of the
  Sinkhorn-balanced `exp(logits)` (GPT-NeoX's at most 3 rounds, `sinkhorn`; no gradient),
  weighted by `sigmoid(logits)` (k = 1) or `softmax(logits)` (k > 1) at those experts; in
  evaluation plain top-k of those weights.

Losses, per MoE layer, on this rank's tokens, before any dropping:
`load_balancing_loss = E * sum_e f_e * P_e` (Switch; f_e = share of the T*k assignments that
chose e, P_e = mean probability of e) and `router_z_loss = mean_t logsumexp(logits_t)^2`
(ST-MoE).

Capacity (with `moe_token_dropping`): each expert computes at most
`max(min_capacity, ceil(T * k / E * capacity_factor))` assignments; the first choices of all
tokens come first, then the second choices, each in token order (GShard/DeepSpeed order); the
assignments beyond capacity are dropped (their weight is zero: the residual carries the token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Route:
    """The routing of `T` tokens: `indices`/`weights` `(T, k)`, `logits`/`probs` `(T, E)`."""

    indices: torch.Tensor
    weights: torch.Tensor
    logits: torch.Tensor
    probs: torch.Tensor


def load_balancing_loss(probs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Switch load-balancing loss `E * sum_e f_e * P_e` (see the module docstring).

    The assignments are counted in int64 whatever the router's dtype: bf16 holds integers
    exactly only up to 256, and a bf16 count stops there (every busy expert would count 256,
    the fractions would be equal and the loss would push nothing). The loss is fp32 at least.
    The count is a scatter-add into `E` slots, not `bincount`, whose CUDA kernel reads the
    input's range back to the host to size its output."""
    num_experts = probs.shape[-1]
    counts = expert_counts(indices.reshape(-1), num_experts)  # (E,) int64, exact
    fraction = counts.float() / indices.numel()
    return num_experts * (fraction * probs.float().mean(dim=0)).sum()


def expert_counts(experts: torch.Tensor, size: int) -> torch.Tensor:
    """int64 `(size,)`: how many entries of `experts` (int64, values in `[0, size)`) name each
    slot, with a static output size (no host read, unlike `bincount`)."""
    counts = torch.zeros(size, dtype=torch.int64, device=experts.device)
    return counts.scatter_add_(0, experts, torch.ones_like(experts))


def expert_one_hot(experts: torch.Tensor, size: int) -> torch.Tensor:
    """int64 `(n, size)`, row `i` the one-hot of `experts[i]` (`(n,)`; a value outside
    `[0, size)` gives a zero row). A comparison with `arange`, not `one_hot`, which on the host
    checks the values' range with two reads."""
    slots = torch.arange(size, device=experts.device)
    return (experts.unsqueeze(-1) == slots).long()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE router z-loss `mean(logsumexp(logits, -1) ** 2)`."""
    return torch.logsumexp(logits, dim=-1).square().mean()


def expert_capacity(tokens: int, top_k: int, num_experts: int, factor: float, minimum: int) -> int:
    """Assignments one expert computes at most: `max(minimum, ceil(tokens*k/E * factor))`."""
    return max(minimum, math.ceil(tokens * top_k / num_experts * factor))


def capacity_keep(indices: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """Bool `(T, k)`: the assignments within their expert's capacity (module docstring)."""
    tokens, k = indices.shape
    slot_major = indices.t().reshape(-1)  # choice 0 of every token, then choice 1, ...
    one_hot = expert_one_hot(slot_major, num_experts)  # (k*T, E)
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1  # place in its expert's queue
    return (position < capacity).reshape(k, tokens).t()


def sinkhorn(cost: torch.Tensor, tol: float = 1e-4, max_iter: int = 3) -> torch.Tensor:
    """GPT-NeoX's Sinkhorn balancing of `exp(cost)` `(T, E)`: from row scales `d0 = 1` and
    column scales `d1 = 1 / (E * column sums)`, at most `max_iter` rounds of rescaling rows
    then columns, stopping after the first round whose column scales changed by less than
    `tol` on average. Not run to convergence: the routing is GPT-NeoX's.

    The stop is applied on the device (later rounds leave the scales as they are), so the
    error is never read on the host: no synchronisation per MoE layer."""
    cost = torch.exp(cost)
    rows, cols = cost.shape
    d0 = torch.ones(rows, dtype=cost.dtype, device=cost.device)
    d1 = 1 / (cols * cost.sum(dim=0))
    eps = 1e-8
    done = torch.zeros((), dtype=torch.bool, device=cost.device)
    for _ in range(max_iter):
        new_d0 = (1 / rows) / ((d1 * cost).sum(dim=1) + eps)
        new_d1 = (1 / cols) / ((new_d0.unsqueeze(1) * cost).sum(dim=0) + eps)
        converged = (d1 - new_d1).abs().mean() < tol
        d0 = torch.where(done, d0, new_d0)
        d1 = torch.where(done, d1, new_d1)
        done = done | converged
    return d1 * cost * d0.unsqueeze(1)


class Router(nn.Module):
    """The router weight `(E, h)` (no bias, replicated on every rank) and the routing rule."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, *, fp32: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.top_k = top_k
        self.fp32 = fp32

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = nn.functional.linear(x, self.weight)
        return logits.float() if self.fp32 else logits

    def forward(self, x: torch.Tensor) -> Route:
        raise NotImplementedError


class TopKRouter(Router):
    """Token-choice top-k over the softmax (module docstring)."""

    def __init__(self, *args, jitter_eps=None, weights: str = "softmax", **kwargs):
        super().__init__(*args, **kwargs)
        self.jitter_eps = jitter_eps
        self.weights_rule = weights

    def forward(self, x: torch.Tensor) -> Route:
        if self.training and self.jitter_eps:
            noise = torch.rand_like(x) * (2 * self.jitter_eps) + (1 - self.jitter_eps)
            x = x * noise
        logits = self._logits(x)
        probs = logits.softmax(dim=-1)
        top, indices = probs.topk(self.top_k, dim=-1)
        if self.weights_rule != "softmax":  # renormalised over the k (both other rules)
            top = top / top.sum(dim=-1, keepdim=True)
        return Route(indices, top, logits, probs)


class SinkhornRouter(Router):
    """Megatron's Sinkhorn router (module docstring)."""

    def __init__(self, *args, jitter_eps=None, weights: str = "softmax", **kwargs):
        super().__init__(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> Route:
        logits = self._logits(x)
        probs = logits.softmax(dim=-1)
        scores = logits.sigmoid() if self.top_k == 1 else probs
        if self.training:
            with torch.no_grad():
                indices = sinkhorn(logits.detach().float()).topk(self.top_k, dim=-1).indices
            weights = scores.gather(1, indices)
        else:
            weights, indices = scores.topk(self.top_k, dim=-1)
        return Route(indices, weights, logits, probs)


ROUTERS: dict[str, type[Router]] = {"topk": TopKRouter, "sinkhorn": SinkhornRouter}
