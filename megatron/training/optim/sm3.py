"""SM3 (Anil et al. 2019, "Memory-Efficient Adaptive Optimization"), dense SM3-II.

A parameter of rank r keeps r accumulators, one per dimension (a row vector and a column
vector for a matrix) instead of a full second-moment tensor. Per step, with gradient g:

    nu    = min over dims of the broadcast accumulators      (× beta, when beta > 0)
    nu   += (1 - beta) × g²
    acc_d = max of nu over every dimension but d             (max with acc_d when beta > 0)
    u     = g / sqrt(nu + eps)
    u     = momentum × m + (1 - momentum) × u                (when momentum > 0)
    p    <- p × (1 - lr × weight_decay) - lr × u

Scalars and vectors keep one accumulator of their own shape (plain Adagrad).
"""

from __future__ import annotations

import torch

from megatron.training.optim.closure import closure_loss, params_with_grads


def _max_except(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Max of `t` over every dimension but `dim`, kept broadcastable (size 1 elsewhere)."""
    for d in range(t.dim()):
        if d != dim:
            t = t.amax(dim=d, keepdim=True)
    return t


class SM3(torch.optim.Optimizer):
    """Memory-efficient Adagrad-style optimizer with per-dimension accumulators."""

    def __init__(
        self,
        params,
        lr: float = 0.1,
        momentum: float = 0.0,
        beta: float = 0.0,
        eps: float = 1e-30,
        weight_decay: float = 0.0,
    ):
        if lr < 0:
            raise ValueError(f"SM3 lr must be >= 0, got {lr}")
        if not 0.0 <= momentum < 1.0 or not 0.0 <= beta < 1.0:
            raise ValueError(f"SM3 momentum ({momentum}) and beta ({beta}) must be in [0, 1)")
        defaults = dict(lr=lr, momentum=momentum, beta=beta, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @staticmethod
    def _accumulators(p: torch.Tensor) -> list[torch.Tensor]:
        if p.dim() <= 1:
            return [torch.zeros_like(p)]
        accs = []
        for d in range(p.dim()):
            shape = [1] * p.dim()
            shape[d] = p.shape[d]
            accs.append(torch.zeros(shape, dtype=p.dtype, device=p.device))
        return accs

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            lr, beta, mom = group["lr"], group["beta"], group["momentum"]
            for p in params_with_grads(group):
                g = p.grad
                state = self.state[p]
                if not state:
                    state["accumulators"] = self._accumulators(p)
                    if mom > 0:
                        state["momentum_buffer"] = torch.zeros_like(p)
                accs = state["accumulators"]
                nu = accs[0]
                for acc in accs[1:]:
                    nu = torch.minimum(nu, acc)  # broadcasts to p's shape
                nu = nu.mul(beta) if beta > 0 else nu.clone()
                nu = nu.expand_as(g).addcmul(g, g, value=1.0 - beta)
                if len(accs) == 1:
                    new = [torch.maximum(accs[0], nu) if beta > 0 else nu]
                else:
                    new = [_max_except(nu, d) for d in range(len(accs))]
                    if beta > 0:
                        new = [torch.maximum(a, n) for a, n in zip(accs, new)]
                for acc, n in zip(accs, new):
                    acc.copy_(n)
                update = nu.add_(group["eps"]).rsqrt_().mul_(g)
                if mom > 0:
                    buf = state["momentum_buffer"]
                    buf.mul_(mom).add_(update, alpha=1.0 - mom)
                    update = buf
                if group["weight_decay"]:
                    p.mul_(1.0 - lr * group["weight_decay"])
                p.add_(update, alpha=-lr)
        return loss
