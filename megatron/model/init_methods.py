"""Weight initialisations, chosen by name (`init_method`, `output_layer_init_method`).

Each entry of `INIT_METHODS` maps `(std, num_layers, hidden_size)` to a function that fills a
FULL weight tensor in place (tensor-parallel layers call it before slicing, so the result does
not depend on tp). `init_method` applies to input projections and embeddings,
`output_layer_init_method` to the projections that write into the residual stream (attention
`dense`, MLP `dense_4h_to_h`). Formulas follow GPT-NeoX:

| name                            | distribution                                    |
| ------------------------------- | ----------------------------------------------- |
| `normal`                        | N(0, std)                                       |
| `scaled_normal`                 | N(0, std / sqrt(2 * num_layers))                |
| `single_residual_scaled_normal` | N(0, std / sqrt(num_layers))                    |
| `small_init`                    | N(0, sqrt(2 / (5 * hidden)))  (Nguyen & Salazar) |
| `wang_init`                     | N(0, 2 / num_layers / sqrt(hidden))  (Wang)      |
| `xavier_uniform`, `xavier_normal` | torch's Xavier/Glorot                          |
| `orthogonal`, `scaled_orthogonal` | (semi-)orthogonal, gain 2 / sqrt(1 or num_layers) |
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from megatron.model.args import ModelArgs, choose

InitFn = Callable[[torch.Tensor], object]


def _normal(std: float) -> InitFn:
    return lambda t: nn.init.normal_(t, mean=0.0, std=std)


def _orthogonal(num_layers: int) -> InitFn:
    return lambda t: nn.init.orthogonal_(t, gain=2.0 / math.sqrt(num_layers))


INIT_METHODS: dict[str, Callable[[float, int, int], InitFn]] = {
    "normal": lambda std, layers, hidden: _normal(std),
    "scaled_normal": lambda std, layers, hidden: _normal(std / math.sqrt(2.0 * layers)),
    "single_residual_scaled_normal": lambda std, layers, hidden: _normal(std / math.sqrt(layers)),
    "small_init": lambda std, layers, hidden: _normal(math.sqrt(2.0 / (5.0 * hidden))),
    "wang_init": lambda std, layers, hidden: _normal(2.0 / layers / math.sqrt(hidden)),
    "xavier_uniform": lambda std, layers, hidden: nn.init.xavier_uniform_,
    "xavier_normal": lambda std, layers, hidden: nn.init.xavier_normal_,
    "orthogonal": lambda std, layers, hidden: _orthogonal(1),
    "scaled_orthogonal": lambda std, layers, hidden: _orthogonal(layers),
}


def build_init_method(name: str, args: ModelArgs, key: str = "init_method") -> InitFn:
    """The fill function for `name` with this model's std, depth and width."""
    make = choose(INIT_METHODS, key, name)
    return make(args.init_method_std, args.num_layers, args.hidden_size)


def input_init(args: ModelArgs) -> InitFn:
    """Initialisation of embeddings and input projections (`init_method`)."""
    return build_init_method(args.init_method, args, "init_method")


def output_init(args: ModelArgs) -> InitFn:
    """Initialisation of residual-writing projections (`output_layer_init_method`)."""
    return build_init_method(args.output_layer_init_method, args, "output_layer_init_method")
