"""MLP activations, chosen by the `activation` key.

Plain activations map one projection `a` to `act(a)`. Gated ones (GLU variants: geglu, swiglu,
reglu) take two projections of the same input, the gate `g` and the value `u`, and return
`act(g) * u`; the MLP then owns one more input projection (see `mlp.py`). Every activation is
elementwise, so it runs unchanged on tensor-parallel shards of the inner dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.model.args import choose


class Activation:
    """`act(a)`; `gated` activations are called as `act(gate, value)`."""

    gated = False

    def __call__(self, a: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class GeLU(Activation):
    """Exact (erf) GELU, as GPT-NeoX and Hugging Face's `gelu` compute it."""

    def __call__(self, a):
        return F.gelu(a)


class GeLUTanh(Activation):
    """GeLU's tanh approximation: what GPT-NeoX's fused bias-GeLU kernel computes."""

    def __call__(self, a):
        return F.gelu(a, approximate="tanh")


class SiLU(Activation):
    def __call__(self, a):
        return F.silu(a)


class ReLU(Activation):
    def __call__(self, a):
        return F.relu(a)


class ReLUSquared(Activation):
    def __call__(self, a):
        return F.relu(a).square()


class GatedActivation(Activation):
    """`act(gate) * value` with `act` one of the plain activations."""

    gated = True

    def __init__(self, inner: Activation):
        self.inner = inner

    def __call__(self, gate, value):
        return self.inner(gate) * value


ACTIVATIONS: dict[str, type[Activation] | tuple[type[Activation]]] = {
    "gelu": GeLU,
    "gelu_tanh": GeLUTanh,
    "silu": SiLU,
    "relu": ReLU,
    "relu_squared": ReLUSquared,
    "geglu": (GeLU,),
    "swiglu": (SiLU,),
    "reglu": (ReLU,),
}


def build_activation(name: str) -> Activation:
    """The activation named by the `activation` key (a 1-tuple entry marks a gated one)."""
    entry = choose(ACTIVATIONS, "activation", name)
    if isinstance(entry, tuple):
        return GatedActivation(entry[0]())
    return entry()
