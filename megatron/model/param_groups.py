"""The optimizer's parameter groups: which parameters take weight decay.

Training builds its optimizer from these groups, and the checkpoint tools rebuild the same
grouping to place optimizer state offline, so the rule lives with the model it reads.
"""

from __future__ import annotations

from typing import Any

import torch


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: decayed (matrices, embeddings) and not decayed (biases, norm weights).

    A parameter may opt out explicitly with `param.no_weight_decay = True`. Empty groups are
    dropped (DeepSpeed rejects them).
    """
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        # A ZeRO-3 parameter built partitioned (`megatron/training/setup/model.py`) is an empty
        # placeholder; its real shape is `ds_shape`.
        ndim = len(getattr(p, "ds_shape", p.shape))
        skip = ndim < 2 or name.endswith(".bias") or getattr(p, "no_weight_decay", False)
        (no_decay if skip else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]
    return [g for g in groups if g["params"]]
