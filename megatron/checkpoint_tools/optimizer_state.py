"""Optimizer state by parameter name with full tensors (`FullOptimizerState`), and its split
for one rank of another tensor/pipeline layout (`shard_optimizer_state`, numbered for that
layout's stage). Reading a checkpoint's state into it is `optimizer_read.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from megatron.checkpoint_tools.schema import ModelSchema, resize_vocab
from megatron.checkpoint_tools.stages import StageModule, optimizer_parameter_names, stage_bounds
from megatron.model.param_groups import has_fp32_groups, param_groups


@dataclass
class FullOptimizerState:
    """Optimizer state by parameter name, with full (unsharded) tensors."""

    per_param: dict[str, dict[str, object]] = field(default_factory=dict)
    groups: dict[str, dict[str, object]] = field(default_factory=dict)
    """Hyperparameters of each parameter group by its `name` (decay, no_decay)."""


def shard_optimizer_state(
    full: FullOptimizerState,
    schema: ModelSchema,
    stage: int,
    stages: int,
    tp: int,
    tp_rank: int,
) -> dict:
    """The torch optimizer `state_dict()` of one rank of the target layout (`schema` describes
    the target model, whose padded vocabulary may differ from the source's)."""
    bounds = stage_bounds(schema, stages, tp)
    module = StageModule(schema, bounds, stage)
    names = {id(p): n for n, p in module.named_parameters()}
    state, groups, index = {}, [], 0
    for group in param_groups(module, 0.0, has_fp32_groups(full.groups)):
        hyper = full.groups.get(group["name"])
        if hyper is None:
            raise ValueError(f"the saved optimizer has no parameter group '{group['name']}'")
        ids = []
        for p in group["params"]:
            name = names[id(p)]
            saved = full.per_param.get(name, {})
            state[index] = _shard_param_state(saved, schema, name, tp, tp_rank)
            ids.append(index)
            index += 1
        groups.append({**hyper, "params": ids})
    if index != len(optimizer_parameter_names(schema, bounds, stage)):
        raise RuntimeError(f"stage {stage}: numbered {index} parameters")
    return {"state": {i: s for i, s in state.items() if s}, "param_groups": groups}


def _shard_param_state(state: dict, schema: ModelSchema, name: str, tp: int, tp_rank: int):
    spec = schema.spec(name)
    out = {}
    for key, value in state.items():
        if torch.is_tensor(value) and value.dim() > 0:
            if spec.is_vocab_table:
                value = resize_vocab(value, spec.shape[0])
            value = schema.shard(name, value, tp, tp_rank)
        elif torch.is_tensor(value):
            # A ZeRO group's one `step` tensor stands for all its parameters; torch's
            # `load_state_dict` keeps a saved step tensor as it is and Adam adds 1 to it in
            # place for each parameter, so a tensor shared by N parameters would count N steps
            # per step (wrong bias correction). Each parameter gets its own.
            value = value.clone()
        out[key] = value
    return out
