"""A process group on paper: the size and rank of a group no processes form.

The memory plan builds and runs a tensor-parallel rank's layers on the `meta` device in one
process. Given a `PlannedGroup` where a layer takes its tensor- or expert-parallel group,
`comm.group_size` and `comm.group_rank` answer from it, so the layer has that rank's shapes,
and the collectives of `comm.py` return tensors of the shapes the real ones would (no values:
`meta` tensors only) and record the bytes each kind of collective was handed (`traffic`,
`calls`), which is the plan's count of tensor-parallel communication.
"""

from __future__ import annotations

import collections

import torch


class PlannedGroup:
    """`size` ranks, this process standing for `rank`; `name` says which group it plays."""

    def __init__(self, size: int, rank: int = 0, name: str = "tensor"):
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"PlannedGroup: rank {rank} of {size} ranks is not a rank")
        self.size, self.rank, self.name = size, rank, name
        self.traffic: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()

    def record(self, kind: str, x: torch.Tensor) -> None:
        """Count a collective of `kind` handed `x` (which must be a `meta` tensor)."""
        if not x.is_meta:
            raise RuntimeError(
                f"a {kind} over a PlannedGroup was handed a {x.device} tensor: a planned "
                "group has no processes and runs on the meta device only"
            )
        self.traffic[kind] += x.numel() * x.element_size()
        self.calls[kind] += 1

    def __repr__(self) -> str:
        return f"PlannedGroup({self.name}, rank {self.rank} of {self.size})"


def is_planned(group) -> bool:
    return isinstance(group, PlannedGroup)
