"""Reading a checkpoint's optimizer state by parameter name, to move it between tensor/pipeline
layouts (ZeRO stage 0, torch optimizers; `optimizer_state.py` holds the result and its split).

Without ZeRO, DeepSpeed saves each model-parallel rank's optimizer `state_dict()` in its
`mp_rank_XX_model_states.pt`: per-parameter tensors (Adam's `exp_avg`, `exp_avg_sq`, ...)
shaped like that rank's shard, numbered in the order of `stages.optimizer_parameter_names`.
`read_optimizer_state` names and merges them into full tensors; `shard_optimizer_state`
splits them for a rank of another layout, numbered for that layout's stage. At expert-parallel
size ep > 1 those files hold expert-parallel rank 0's experts' state and the others' come from
`expert_states_pp*_ep*.pt` (`experts.py`), joined into the full `(E, ...)` state.

ZeRO stages 1-3 keep the state in flat partitions over the data-parallel ranks; `zero_state.py` cuts
them back into parameters (fp32 runs). Other cases keep their state in forms tied to the old layout,
and `read_optimizer_state` returns the reason instead, naming the optimizer: the fp16/bf16 optimizer
wrappers (flat fp32 master groups) and optimizers whose state is not elementwise
(`OptimizerType.whole_parameter` in `megatron/config/groups/optimizer.py::OPTIMIZER_TYPES`: SM3's
per-dimension accumulators, 1-bit Adam's error feedback and DisTrO's per-rank momenta).
"""

from __future__ import annotations

import torch

from megatron.checkpoint.experts import is_expert_name, saved_expert_parallel_size
from megatron.checkpoint_tools.experts import join_expert_optimizer
from megatron.checkpoint_tools.optimizer_state import FullOptimizerState
from megatron.checkpoint_tools.schema import ModelSchema
from megatron.checkpoint_tools.stages import optimizer_parameter_names, stage_bounds
from megatron.checkpoint_tools.universal import UNIVERSAL_STAGES
from megatron.checkpoint_tools.zero_state import read_zero_optimizer_state
from megatron.config.groups.optimizer import OPTIMIZER_TYPES


def _zero_stage(cfg) -> int:
    return int(getattr(cfg.parallel, "zero_stage", 0) or 0)


def unmovable_reason(cfg, zero_stage: int = 0) -> str:
    """Why the optimizer state of a run with `cfg` cannot change layout for a run with ZeRO
    `zero_stage` ("" when it can)."""
    name = cfg.optimizer.optimizer_type
    if name not in OPTIMIZER_TYPES or OPTIMIZER_TYPES[name].whole_parameter:
        # Element-wise optimizers keep tensors shaped like each parameter plus scalars (step
        # counts): those are split and merged like the weights.
        movable = sorted(n for n, o in OPTIMIZER_TYPES.items() if not o.whole_parameter)
        return (
            f"optimizer '{name}' keeps state that is not elementwise per parameter (those "
            f"that can move: {', '.join(movable)})"
        )
    precision, source = cfg.precision.dtype, _zero_stage(cfg)
    if source > 0 and precision != "fp32":
        if precision == "bf16" and source in UNIVERSAL_STAGES and zero_stage in UNIVERSAL_STAGES:
            return ""  # fp32 master weights and moments into DeepSpeed's universal layout
        return (
            f"ZeRO with precision {precision} (stage {source}): only bf16 ZeRO 1/2 checkpoints "
            "move, and only to a ZeRO 1/2 run (tools/reshard.py --zero-stage 1 or 2: fp32 "
            "master weights and moments in DeepSpeed's universal layout); fp16 would lose its "
            "loss scale, ZeRO-3 bf16 is not verified"
        )
    return ""


def read_optimizer_state(reader, zero_stage: int = 0) -> tuple[FullOptimizerState | None, str]:
    """`(state, "")`, or `(None, why it cannot be moved)` for a run with ZeRO `zero_stage`."""
    why = unmovable_reason(reader.cfg, zero_stage)
    if why:
        return None, why
    ep = saved_expert_parallel_size(reader.folder) if reader.args.moe_num_experts > 1 else 1
    if _zero_stage(reader.cfg) > 0 and ep > 1:
        return None, (
            f"ZeRO partitions saved at moe_expert_parallel_size {ep} are not read by the "
            "checkpoint tools"
        )
    if _zero_stage(reader.cfg) > 0:
        return read_zero_optimizer_state(reader)
    layout, schema = reader.layout, reader.schema
    old = reader.old_numbering  # the stages of the layer list it was saved with
    bounds = stage_bounds(schema, layout.stages, layout.tp, legacy=old)
    full = FullOptimizerState()
    for stage in range(layout.stages):
        names = optimizer_parameter_names(schema, bounds, stage, legacy=old)
        shards: list[dict] = []
        for t in range(layout.tp):
            saved = reader.mp_rank_state(stage * layout.tp + t).get("optimizer")
            if not isinstance(saved, dict) or set(saved) != {"state", "param_groups"}:
                return None, "it is not a plain torch optimizer state (fp16/bf16 wrapper?)"
            numbered = [i for g in saved["param_groups"] for i in g["params"]]
            if len(numbered) != len(names):
                return None, (
                    f"stage {stage} numbers {len(numbered)} parameters, the model has "
                    f"{len(names)} there"
                )
            shards.append({n: saved["state"].get(i, {}) for n, i in zip(names, numbered)})
            for group in saved["param_groups"]:
                hyper = {k: v for k, v in group.items() if k != "params"}
                full.groups.setdefault(str(group.get("name")), hyper)
        for name in names:
            if name in full.per_param:  # the tied embedding's copy on the last stage
                continue
            states = [s[name] for s in shards]
            merged = _merge_param_state(schema, name, states, ep)
            if merged is None:
                keys = sorted(states[0])
                return None, f"its state of '{name}' ({keys}) is not shaped like the parameter"
            full.per_param[name] = merged
    if ep > 1:
        why = join_expert_optimizer(full, reader.folder, ep, layout.stages)
        return (None, why) if why else (full, "")
    return full, ""


def _merge_param_state(
    schema: ModelSchema, name: str, states: list[dict], ep: int = 1
) -> dict | None:
    """Full tensors of one parameter's state; None when a tensor is neither shaped like the
    parameter's shard nor a scalar (SM3's per-dimension accumulators, 1-bit Adam's error
    buffers): such state has no layout-free meaning here."""
    spec = schema.spec(name)
    tp = len(states)
    shard_shape = list(spec.shape)
    if spec.partition_dim is not None:
        shard_shape[spec.partition_dim] //= tp
    if ep > 1 and is_expert_name(name):  # expert-parallel rank 0's experts only
        shard_shape[0] //= ep
    merged = {}
    for key, value in states[0].items():
        if torch.is_tensor(value) and list(value.shape) == shard_shape:
            merged[key] = schema.merge(name, [s[key] for s in states])
        elif torch.is_tensor(value) and value.dim() > 0:
            return None
        else:  # step counters and other scalars: the same on every rank
            merged[key] = value
    return merged
