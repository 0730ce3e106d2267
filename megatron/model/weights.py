"""Full (unsharded) weights of a built model: gather them, or load them into the shards.

Names are the model's own (`specs.py`: `{layer index}.{name in layer}` and
`tied_modules.embed.*`), identical for the pipeline module and the plain model, so a full state
dict taken from one layout loads into any other (each pipeline stage simply finds the names of
its own layers). Used by the parity tests and by checkpoint conversion with `hf_names.py`.
"""

from __future__ import annotations

import torch

from megatron.parallel import gather_full_parameter, is_tensor_parallel
from megatron.parallel.comm import split_along


def full_state_dict(model: torch.nn.Module, tp_group=None, *, grads: bool = False) -> dict:
    """`{name: full tensor}` of this rank's parameters (or of their gradients with `grads`).

    Collective over `tp_group` for tensor-parallel shards: call it on every tp rank. With
    `grads`, parameters without a gradient are left out.
    """
    out = {}
    for name, p in model.named_parameters():
        if grads and p.grad is None:
            continue
        out[name] = gather_full_parameter(p, tp_group, grad=grads)
    return out


def load_full_state_dict(
    model: torch.nn.Module, state: dict, tp_group=None, *, strict: bool = True
) -> list[str]:
    """Copy full tensors from `state` into this rank's parameters (its slice of each shard).

    Returns the names of `model`'s parameters missing from `state`; with `strict` (default)
    a missing name or a shape mismatch raises a `KeyError`/`ValueError` naming it. Names in
    `state` that this rank does not hold (other pipeline stages) are ignored.
    """
    missing = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in state:
                missing.append(name)
                continue
            full = state[name]
            shard = split_along(full, p.partition_dim, tp_group) if is_tensor_parallel(p) else full
            if shard.shape != p.shape:
                raise ValueError(
                    f"parameter '{name}': the given tensor {tuple(full.shape)} gives a shard of "
                    f"{tuple(shard.shape)} but the model holds {tuple(p.shape)}"
                )
            p.copy_(shard)
    if strict and missing:
        raise KeyError(
            f"{len(missing)} parameters of the model are not in the state dict, e.g. {missing[:5]}"
        )
    return missing
