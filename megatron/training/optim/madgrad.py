"""MADGRAD (Defazio & Jelassi 2021) with decoupled weight decay (`madgrad_wd`).

Dual averaging with a cube-root denominator. At step k (from 0), with gradient g:

    lamb  = lr × sqrt(k + 1)
    s    += lamb × g
    nu   += lamb × g²
    z     = x0 - s / (nu^(1/3) + eps)                   (x0: the parameter at the first step)
    p    <- p × (1 - lr × weight_decay)                 (decoupled weight decay)
    p    <- (1 - c) × p + c × z,   c = 1 - momentum
"""

from __future__ import annotations

import math

import torch

from megatron.training.optim.closure import closure_loss, params_with_grads


class MADGRAD(torch.optim.Optimizer):
    """Momentumized, adaptive, dual-averaged gradient method; three state tensors per param."""

    def __init__(
        self,
        params,
        lr: float = 1e-2,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eps: float = 1e-6,
    ):
        if lr < 0 or eps < 0:
            raise ValueError(f"madgrad_wd lr ({lr}) and eps ({eps}) must be >= 0")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"madgrad_wd momentum must be in [0, 1), got {momentum}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eps=eps)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            c = 1.0 - group["momentum"]
            for p in params_with_grads(group):
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["s"] = torch.zeros_like(p)
                    state["grad_sum_sq"] = torch.zeros_like(p)
                    state["x0"] = p.detach().clone()
                lamb = lr * math.sqrt(state["step"] + 1)
                state["step"] += 1
                state["s"].add_(p.grad, alpha=lamb)
                state["grad_sum_sq"].addcmul_(p.grad, p.grad, value=lamb)
                rms = state["grad_sum_sq"].pow(1.0 / 3.0).add_(eps)
                z = state["x0"].addcdiv(state["s"], rms, value=-1.0)
                if wd:
                    p.mul_(1.0 - lr * wd)
                p.mul_(1.0 - c).add_(z, alpha=c)
        return loss
