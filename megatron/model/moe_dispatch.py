"""Sending the gathered tokens to this rank's experts and their outputs back, without waiting
for the device where the shapes allow it.

Both functions take the expert-parallel group's tokens `(N, h)`, their experts `indices`
`(N, k)` (global ids; -1 for an assignment dropped over capacity) and `weights` `(N, k)`, and
return `(N, h)`: per token, the sum over its assignments to this rank's experts of
`weight * expert(token)`. A token goes to the same experts with the same weights either way.

- `capacity_dispatch` (`moe_token_dropping`): every source rank kept at most `capacity`
  assignments per expert, so an expert gets at most `ep * capacity` of them: the tokens are
  scattered into a fixed `(E/ep, ep * capacity, h)` buffer, the experts run batched on it and
  each assignment gathers its row back. Every shape is known on the host: no read.
- `dropless_dispatch`: an expert can get any number of tokens, and running each expert on
  the tokens that chose it needs those numbers on the host to size its input. The assignments
  are sorted by expert once and the per-expert counts read in one transfer (`tolist` of
  `E/ep` integers): one read per MoE layer per forward (activation recompute runs the forward,
  and the read, again), where a `nonzero` per expert read `E/ep`. Static shapes would need a
  buffer of `N` rows per expert, `E / k` times the expert compute; a grouped GEMM taking the
  offsets on the device would read nothing.
"""

from __future__ import annotations

import torch

from megatron.model.moe_router import expert_counts, expert_one_hot


def _local_experts(indices: torch.Tensor, first: int, local: int):
    """`(N*k,)` each assignment's local expert (`local` where not on this rank) and its mask."""
    here = indices.reshape(-1) - first  # (N*k,) token-major
    mine = (here >= 0) & (here < local)
    return torch.where(mine, here, local), mine


def capacity_slots(indices: torch.Tensor, first: int, local: int, slots: int) -> torch.Tensor:
    """int64 `(N, k)`: each assignment's row in a `(local * slots + 1, h)` buffer, expert `e`'s
    queue in rows `e * slots ...` in token-major order; the last row takes the assignments to
    no expert of this rank (dropped, or another rank's)."""
    expert, mine = _local_experts(indices, first, local)
    one_hot = expert_one_hot(expert, local)  # (N*k, local); zero rows where not mine
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1  # place in its expert's queue
    slot = torch.where(mine, expert * slots + position, local * slots)
    return slot.view_as(indices)


def capacity_dispatch(experts, tokens, indices, weights, slots: int) -> torch.Tensor:
    """Static-shape dispatch (module docstring); `slots = ep * capacity`."""
    local, h = experts.local, tokens.shape[-1]
    slot = capacity_slots(indices, experts.first, local, slots)  # (N, k)
    buffer = tokens.new_zeros(local * slots + 1, h)
    for j in range(slot.shape[1]):
        buffer = buffer.index_add(0, slot[:, j], tokens)
    y = experts.batched(buffer[:-1].view(local, slots, h))  # (local, slots, h)
    y = torch.cat([y.reshape(local * slots, h), y.new_zeros(1, h)])  # the last row: nothing
    out = y[slot[:, 0]] * weights[:, :1]
    for j in range(1, slot.shape[1]):
        out = out + y[slot[:, j]] * weights[:, j : j + 1]
    return out  # (N, h)


def dropless_dispatch(experts, tokens, indices, weights, out) -> torch.Tensor:
    """`out` `(N, h)` plus this rank's experts' outputs (module docstring): one host read."""
    local, k = experts.local, indices.shape[1]
    expert, _ = _local_experts(indices, experts.first, local)
    order = torch.sort(expert, stable=True).indices  # (N*k,) by expert, then token-major
    sizes = expert_counts(expert, local + 1)[:local].tolist()  # the one read
    chosen = order[: sum(sizes)]
    rows = chosen // k
    x = tokens[rows]  # (M, h), expert 0's tokens first
    y = torch.cat([experts.expert(e, part) for e, part in enumerate(x.split(sizes))])
    y = y * weights.reshape(-1)[chosen].unsqueeze(-1)
    return out.index_add(0, rows, y)
