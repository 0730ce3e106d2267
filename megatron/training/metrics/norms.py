"""Optional per-parameter figures for the logs: `log_param_norm` and `log_grad_norm`.

Both are this rank's (global rank 0's) view: a tensor-parallel parameter contributes its
shard, and `grad_norm/{name}` is the local gradient accumulated over the step's micro-batches,
taken when autograd finishes accumulating it, before DeepSpeed averages it over data-parallel
ranks or partitions it (ZeRO). The global gradient norm of the step is `grad_norm` itself.

The norms are computed on the device and stay there; a log step reads all of them in one
transfer (`host_floats`). Reading each norm as it is taken would make the backward pass wait
for the device once per parameter per micro-batch.
"""

from __future__ import annotations

import torch

from megatron.training.metrics.monitor import host_floats


def host_norms(norms: dict[str, torch.Tensor]) -> dict[str, float]:
    """`norms` with their 0-dim device values read in one transfer."""
    return dict(zip(norms, host_floats(list(norms.values()))))


def parameter_norms(model: torch.nn.Module) -> dict[str, float]:
    """`{"param_norm/{name}": norm}` of this rank's parameters (ZeRO-3 shards included)."""
    norms = {}
    for name, p in model.named_parameters():
        data = getattr(p, "ds_tensor", None) if p.numel() == 0 else p
        if data is not None and data.numel():
            norms[f"param_norm/{name}"] = data.detach().float().norm()
    return host_norms(norms)


class GradNormRecorder:
    """Keeps, on the device, the norm of each parameter's gradient as autograd accumulates it."""

    def __init__(self, model: torch.nn.Module):
        self.latest: dict[str, torch.Tensor] = {}
        self.handles = [
            p.register_post_accumulate_grad_hook(self._hook(name))
            for name, p in model.named_parameters()
            if p.requires_grad
        ]

    def _hook(self, name: str):
        def record(param):
            if param.grad is not None:
                self.latest[f"grad_norm/{name}"] = param.grad.detach().float().norm()

        return record

    def collect(self) -> dict[str, float]:
        """The norms seen since the last call, read in one transfer."""
        norms, self.latest = self.latest, {}
        return host_norms(norms)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
