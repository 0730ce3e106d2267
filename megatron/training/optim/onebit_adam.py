"""1-bit Adam (Tang et al. 2021): Adam whose momentum is exchanged as signs after a warm-up.

DeepSpeed 0.19 no longer ships `OneBitAdam`, so it lives here. Two stages:

* warm-up (the first `freeze_step` steps): plain Adam (no bias correction, as DeepSpeed's);
  the engine all-reduces the gradients as usual.
* compression (afterwards): the second moment is frozen and the engine stops all-reducing
  gradients (`attach_engine`). Each data-parallel rank updates its momentum with its *local*
  gradient, adds its error-feedback buffer, and sends only the signs (packed 8 per byte)
  and one scale: `compressed = sign(x) × ||x||₂ / sqrt(numel)`. Every rank gathers all of
  them, averages, and compresses the average once more with a server error buffer; the
  result, identical on every rank, is the new momentum.

Update: `p <- p - lr × (m / (sqrt(v) + eps) + weight_decay × p)`.

Not for ZeRO (the engine's partitioned gradients are already reduced).
"""

from __future__ import annotations

import torch

from megatron.parallel.comm import all_gather_list, group_size
from megatron.training.optim.closure import closure_loss, params_with_grads

_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Signs of a flat tensor (zero counts as +) packed 8 per uint8: (n,) → (ceil(n / 8),)."""
    positive = (x >= 0).to(torch.uint8)
    pad = (-positive.numel()) % 8
    positive = torch.nn.functional.pad(positive, (0, pad)).view(-1, 8)  # (n/8, 8)
    return (positive * _BITS.to(x.device)).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of `pack_signs`: (ceil(n / 8),) uint8 → (n,) of ±1."""
    bits = packed.unsqueeze(1).bitwise_and(_BITS.to(packed.device)).ne(0)  # (n/8, 8)
    return bits.view(-1)[:n].to(dtype) * 2 - 1


def compress(x: torch.Tensor) -> torch.Tensor:
    """1-bit approximation with the same L2 norm: sign(x) × ||x|| / sqrt(numel)."""
    scale = x.norm() / x.numel() ** 0.5
    return torch.where(x >= 0, scale, -scale)


def compressed_mean(x: torch.Tensor, worker_error, server_error, group=None) -> torch.Tensor:
    """Mean of `x` over the ranks of `group`, exchanged as signs plus one scale per rank."""
    flat = x.reshape(-1) + worker_error
    sent = compress(flat)
    worker_error.copy_(flat - sent)
    world = group_size(group)
    if world > 1:
        scale = (flat.norm() / flat.numel() ** 0.5).reshape(1).float()
        all_signs = all_gather_list(pack_signs(flat), group)
        all_scales = all_gather_list(scale, group)
        total = torch.zeros_like(flat)
        for s, c in zip(all_signs, all_scales):
            # ±scale in fp32, multiplied on the device (an `alpha=` would read c back)
            total.add_(unpack_signs(s, flat.numel(), c.dtype) * c)
        sent = total / world
    merged = sent + server_error
    out = compress(merged)
    server_error.copy_(merged - out)
    return out.view_as(x)


class OneBitAdam(torch.optim.Optimizer):
    """1-bit Adam; `cuda_aware` and `comm_backend_name` are accepted for DeepSpeed configs."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        freeze_step: int = 100000,
        group=None,
        cuda_aware: bool = False,
        comm_backend_name: str | None = None,
    ):
        if freeze_step < 1:
            raise ValueError(f"OneBitAdam freeze_step must be >= 1, got {freeze_step}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.freeze_step = freeze_step
        self.group = group
        self.engine = None
        self.steps = 0

    @property
    def frozen(self) -> bool:
        """True once the warm-up is over: gradients stay local and momentum is compressed."""
        return self.steps >= self.freeze_step

    def attach_engine(self, engine, group=None) -> None:
        """Let the optimizer switch the engine's gradient all-reduce off after the warm-up;
        `group` is the data-parallel process group the momentum is averaged over."""
        self.engine = engine
        self.group = group
        self._sync_engine()

    def _sync_engine(self) -> None:
        if self.engine is None:
            return
        self.engine.enable_backward_allreduce = not self.frozen
        if hasattr(self.engine, "pipeline_enable_backward_allreduce"):
            self.engine.enable_backward_allreduce = False  # the pipeline engine's own flag rules
            self.engine.pipeline_enable_backward_allreduce = not self.frozen

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        compressing = self.frozen
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in params_with_grads(group):
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                    state["worker_error"] = torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
                    state["server_error"] = torch.zeros_like(state["worker_error"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
                if compressing:
                    m.copy_(
                        compressed_mean(m, state["worker_error"], state["server_error"], self.group)
                    )
                else:
                    v.mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
                update = m / (v.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                p.add_(update, alpha=-group["lr"])
        self.steps += 1
        self._sync_engine()
        return loss

    def state_dict(self):
        state = super().state_dict()
        state["onebit_steps"] = self.steps
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        self.steps = int(state_dict.pop("onebit_steps", 0))
        super().load_state_dict(state_dict)
        self._sync_engine()
