"""A converted optimizer state gives each parameter its own Adam step count.

DeepSpeed's ZeRO optimizers keep one `step` tensor per parameter group; `zero_state.py` hands
that one tensor to every parameter of the group. torch's `load_state_dict` keeps a saved step
tensor as it is and Adam adds 1 to it in place per parameter, so a shared tensor would count
one step per parameter (wrong bias correction; it made resumed losses 4e-3 off). Here the
state written for a rank is loaded into torch's AdamW, which takes one step.
"""

from __future__ import annotations

import torch

from megatron.checkpoint_tools.optimizer_state import FullOptimizerState, shard_optimizer_state
from megatron.checkpoint_tools.schema import ModelSchema
from megatron.checkpoint_tools.stages import optimizer_parameter_names, stage_bounds
from megatron.model import ModelArgs
from tests.tiny import resolve, tiny_settings


def test_a_shared_zero_group_step_becomes_one_count_per_parameter(tmp_path):
    schema = ModelSchema(ModelArgs.from_config(resolve(tiny_settings(tmp_path), 1)))
    step = torch.tensor(4.0)  # one tensor for the whole group, as zero_state.py reads it
    hyper = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1e-3).param_groups[0]
    hyper = {k: v for k, v in hyper.items() if k != "params"}
    full = FullOptimizerState(
        per_param={
            name: {
                "step": step,
                "exp_avg": torch.zeros(spec.shape),
                "exp_avg_sq": torch.zeros(spec.shape),
            }
            for name, spec in schema.params.items()
        },
        groups={
            "decay": {**hyper, "weight_decay": 0.1, "name": "decay"},
            "no_decay": {**hyper, "weight_decay": 0.0, "name": "no_decay"},
        },
    )
    saved = shard_optimizer_state(full, schema, stage=0, stages=1, tp=1, tp_rank=0)

    names = optimizer_parameter_names(schema, stage_bounds(schema, 1, 1), 0)
    params = [torch.nn.Parameter(torch.zeros(schema.params[n].shape)) for n in names]
    groups, start = [], 0
    for group in saved["param_groups"]:
        count = len(group["params"])
        groups.append({"params": params[start : start + count], "name": group["name"]})
        start += count
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    optimizer.load_state_dict(saved)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()

    steps = [float(optimizer.state[p]["step"]) for p in params]
    assert len(steps) > 1 and steps == [5.0] * len(params)
    assert float(step) == 4.0  # the source state is not changed either
