"""What every optimizer written here does around its update, in one place."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch


def closure_loss(closure: Callable[[], torch.Tensor] | None) -> torch.Tensor | None:
    """The loss `closure` returns, evaluated with gradients on (torch's `step(closure)`
    contract); None without a closure."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def params_with_grads(group: dict) -> Iterator[torch.Tensor]:
    """The parameters of an optimizer's `group` that received a gradient this step."""
    return (p for p in group["params"] if p.grad is not None)
