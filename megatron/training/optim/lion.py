"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms").

Per step, with gradient g and momentum m:

    p <- p × (1 - lr × weight_decay) - lr × sign(beta1 × m + (1 - beta1) × g)
    m <- beta2 × m + (1 - beta2) × g
"""

from __future__ import annotations

import torch

from megatron.training.optim.closure import closure_loss, params_with_grads


class Lion(torch.optim.Optimizer):
    """Sign-of-momentum optimizer with decoupled weight decay; one state tensor per param."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0):
        if lr < 0:
            raise ValueError(f"Lion lr must be >= 0, got {lr}")
        for beta in betas:
            if not 0.0 <= beta <= 1.0:
                raise ValueError(f"Lion betas must be in [0, 1], got {tuple(betas)}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in params_with_grads(group):
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                if wd:
                    p.mul_(1.0 - lr * wd)
                update = m.mul(beta1).add_(p.grad, alpha=1.0 - beta1).sign_()
                p.add_(update, alpha=-lr)
                m.mul_(beta2).add_(p.grad, alpha=1.0 - beta2)
        return loss
