"""The optimizer's parameter groups: which parameters take weight decay, and which stay fp32.

Training builds its optimizer from these groups, and the checkpoint tools rebuild the same
grouping to place optimizer state offline, so the rule lives with the model it reads.

A parameter marked `keep_fp32` (Mamba's `A_log` and `D` under `mamba_selective_fp32_params`)
stays fp32 in an fp16/bf16 run. DeepSpeed's optimizer wrappers flatten each group into one
buffer of one dtype, so in such a run (`fp32_groups=True`) the marked parameters form groups of
their own, `<group>_fp32` (the parent group's settings), after all the others: DeepSpeed's ZeRO
optimizer takes the model's dtype from the first group's first parameter.
"""

from __future__ import annotations

from typing import Any

import torch

KEEP_FP32 = "keep_fp32"
"""The attribute that marks a parameter to stay fp32 in a half-precision run."""
FP32_SUFFIX = "_fp32"
"""The name suffix of a group of fp32 parameters (`decay_fp32`, `no_decay_fp32`)."""


def keep_fp32(param: torch.nn.Parameter) -> torch.nn.Parameter:
    """Mark `param` to stay fp32, with its gradient and optimizer state, in an fp16/bf16 run."""
    setattr(param, KEEP_FP32, True)
    return param


def keeps_fp32(param: torch.Tensor) -> bool:
    return getattr(param, KEEP_FP32, False)


def param_groups(
    model: torch.nn.Module, weight_decay: float, fp32_groups: bool = False
) -> list[dict[str, Any]]:
    """Two groups: decayed (matrices, embeddings) and not decayed (biases, norm weights); with
    `fp32_groups` (an fp16/bf16 run) the `keep_fp32` parameters of each in a `<name>_fp32`
    group placed after the others (module docstring).

    A parameter may opt out of decay explicitly with `param.no_weight_decay = True`. Empty
    groups are dropped (DeepSpeed rejects them).
    """
    decay, no_decay, decay32, no_decay32 = [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        # A ZeRO-3 parameter built partitioned (`megatron/training/setup/model.py`) is an empty
        # placeholder; its real shape is `ds_shape`.
        ndim = len(getattr(p, "ds_shape", p.shape))
        skip = ndim < 2 or name.endswith(".bias") or getattr(p, "no_weight_decay", False)
        fp32 = fp32_groups and keeps_fp32(p)
        ((no_decay32 if fp32 else no_decay) if skip else (decay32 if fp32 else decay)).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
        {"params": decay32, "weight_decay": weight_decay, "name": "decay" + FP32_SUFFIX},
        {"params": no_decay32, "weight_decay": 0.0, "name": "no_decay" + FP32_SUFFIX},
    ]
    return [g for g in groups if g["params"]]


def has_fp32_groups(group_names) -> bool:
    """Whether an optimizer with groups `group_names` kept fp32 groups (a saved one, read by
    the checkpoint tools to rebuild its layout)."""
    return any(FP32_SUFFIX in str(name) for name in group_names)
