"""Normalisation layers, chosen by the `norm` key: layernorm, rmsnorm, scalenorm, and the
non-parametric layernorm.

All normalise over the last (hidden) dim and are replicated on every tensor-parallel rank.
Under sequence parallelism each rank normalises only its sequence chunk, so the parameters are
marked `sequence_parallel` (their gradients are summed over tp, see `megatron.parallel.params`).
Epsilons come from `layernorm_epsilon`, `rms_norm_epsilon` and `scalenorm_epsilon`; the bias
from `use_bias_in_norms` (scalenorm has a single gain and never a bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model.args import ModelArgs, choose
from megatron.parallel import mark_sequence_parallel


class _Norm(nn.Module):
    def __init__(self, dim: int, eps: float, bias: bool, sequence_parallel: bool):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        if sequence_parallel:
            for p in self.parameters():
                mark_sequence_parallel(p)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, bias={self.bias is not None}"


class LayerNorm(_Norm):
    """`(x - mean) / sqrt(var + eps) * weight + bias` (torch's layer norm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)


class RMSNorm(_Norm):
    """`x / sqrt(mean(x^2) + eps) * weight (+ bias)`, the statistic computed in fp32 (Llama)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * normed.to(x.dtype)
        return out + self.bias if self.bias is not None else out


class ScaleNorm(nn.Module):
    """`g * x / max(||x||, eps)` with one learned scalar gain `g` (Nguyen & Salazar)."""

    def __init__(self, dim: int, eps: float, bias: bool, sequence_parallel: bool):
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.ones(1))
        if sequence_parallel:
            mark_sequence_parallel(self.g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps) * self.g


class NonParametricLayerNorm(nn.Module):
    """Layer norm without weight or bias (OLMo)."""

    def __init__(self, dim: int, eps: float, bias: bool, sequence_parallel: bool):
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.dim,), None, None, self.eps)


# norm name -> (class, the ModelArgs field holding its epsilon)
NORMS: dict[str, tuple[type[nn.Module], str]] = {
    "layernorm": (LayerNorm, "layernorm_epsilon"),
    "rmsnorm": (RMSNorm, "rms_norm_epsilon"),
    "scalenorm": (ScaleNorm, "scalenorm_epsilon"),
    "non_parametric_layernorm": (NonParametricLayerNorm, "layernorm_epsilon"),
}


def build_norm(args: ModelArgs, dim: int | None = None, sequence_parallel: bool = False):
    """The configured norm over `dim` (default: the hidden size)."""
    cls, eps_key = choose(NORMS, "norm", args.norm)
    return cls(
        dim or args.hidden_size,
        eps=getattr(args, eps_key),
        bias=args.use_bias_in_norms,
        sequence_parallel=sequence_parallel,
    )
