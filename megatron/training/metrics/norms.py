"""Optional per-parameter figures for the logs: `log_param_norm` and `log_grad_norm`.

Both are this rank's (global rank 0's) view: a tensor-parallel parameter contributes its
shard, and `grad_norm/{name}` is the local gradient accumulated over the step's micro-batches,
read when autograd finishes accumulating it, before DeepSpeed averages it over data-parallel
ranks or partitions it (ZeRO). The global gradient norm of the step is `grad_norm` itself.
"""

from __future__ import annotations

import torch


def parameter_norms(model: torch.nn.Module) -> dict[str, float]:
    """`{"param_norm/{name}": norm}` of this rank's parameters (ZeRO-3 shards included)."""
    norms = {}
    for name, p in model.named_parameters():
        data = getattr(p, "ds_tensor", None) if p.numel() == 0 else p
        if data is not None and data.numel():
            norms[f"param_norm/{name}"] = float(data.detach().float().norm())
    return norms


class GradNormRecorder:
    """Keeps the norm of each parameter's gradient as autograd accumulates it."""

    def __init__(self, model: torch.nn.Module):
        self.latest: dict[str, float] = {}
        self.handles = [
            p.register_post_accumulate_grad_hook(self._hook(name))
            for name, p in model.named_parameters()
            if p.requires_grad
        ]

    def _hook(self, name: str):
        def record(param):
            if param.grad is not None:
                self.latest[f"grad_norm/{name}"] = float(param.grad.detach().float().norm())

        return record

    def collect(self) -> dict[str, float]:
        """The norms seen since the last call."""
        norms, self.latest = self.latest, {}
        return norms

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
