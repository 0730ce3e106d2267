"""Expert parallelism in checkpoints written offline: full experts cut into expert-parallel slices.

A run with `moe_expert_parallel_size` ep > 1 saves (`megatron/checkpoint/experts.py`,
the one definition of the files): DeepSpeed's own files hold expert-parallel rank 0's experts
(`(E/ep, ...)`, experts `0 .. E/ep - 1` of each MoE layer, and their optimizer state), and
`expert_states_pp{P}_ep{r}.pt` holds rank r's slice of pipeline stage P's experts for each
`0 < r < ep`. `write_checkpoint` writes the same: `rank_slice` cuts every expert tensor (and its
optimizer state) for DeepSpeed's files, and `expert_files` writes the others' files. Expert
tensors are whole on every tensor-parallel rank, so one file per stage and rank serves them all.

`join_expert_optimizer` is the reading side for the optimizer state (the weights come back whole
through `CheckpointReader`): the `optimizer` entries of those files appended, in expert order,
to rank 0's state read from DeepSpeed's files.
"""

from __future__ import annotations

from pathlib import Path

import torch

from megatron.checkpoint.experts import (  # noqa: F401 (saved_...: for the pre-flight)
    expert_file,
    is_expert_name,
    saved_expert_parallel_size,
)
from megatron.checkpoint.safe_load import load_file
from megatron.checkpoint_tools.optimizer_state import FullOptimizerState
from megatron.checkpoint_tools.schema import ModelSchema
from megatron.checkpoint_tools.stages import stage_bounds, stage_parameter_names


def check_expert_parallel(schema: ModelSchema, ep: int) -> None:
    """Raise a `ValueError` when the model's experts cannot be split over `ep` ranks."""
    experts = schema.args.moe_num_experts
    if ep < 1:
        raise ValueError(f"moe_expert_parallel_size must be >= 1, got {ep}")
    if ep > 1 and experts <= 1:
        raise ValueError(
            f"moe_expert_parallel_size {ep} needs a model with experts (moe_num_experts "
            f"{experts}); use 1"
        )
    if experts > 1 and experts % ep:
        raise ValueError(
            f"moe_expert_parallel_size {ep} must divide moe_num_experts {experts}; choose one "
            "of its divisors"
        )


def _cut(name: str, value, ep: int, rank: int):
    """Rank `rank`'s contiguous experts `rank * E/ep ..` of an expert tensor (`moe.py`'s
    `Experts.first`); other values copied (a step tensor each: torch counts a shared one once
    per parameter)."""
    if ep == 1 or not is_expert_name(name) or not torch.is_tensor(value) or value.dim() == 0:
        return value.clone() if torch.is_tensor(value) else value
    return value.chunk(ep, dim=0)[rank].clone()


def rank_slice(state: dict, ep: int, rank: int) -> dict:
    """`{name: tensor}` with every expert tensor cut to expert-parallel rank `rank`'s experts
    (the others as they are)."""
    if ep == 1:
        return state
    return {
        name: _cut(name, t, ep, rank) if is_expert_name(name) else t for name, t in state.items()
    }


def optimizer_slice(full: FullOptimizerState | None, ep: int, rank: int):
    """`full` with the state of every expert cut to rank `rank`'s experts."""
    if full is None or ep == 1:
        return full
    per_param = {
        name: {k: _cut(name, v, ep, rank) for k, v in values.items()} if is_expert_name(name)
        else values
        for name, values in full.per_param.items()
    }  # fmt: skip
    return FullOptimizerState(per_param=per_param, groups=full.groups)


def _stage_expert_names(schema: ModelSchema, pp: int, tp: int) -> list[list[str]]:
    """The expert parameter names of each pipeline stage (one list for the plain engine)."""
    experts = [name for name in schema.params if is_expert_name(name)]
    if pp < 1:
        return [experts]
    bounds = stage_bounds(schema, pp, tp)
    return [
        [n for n in stage_parameter_names(schema, bounds, s) if is_expert_name(n)]
        for s in range(pp)
    ]


def expert_files(
    folder: Path,
    schema: ModelSchema,
    state: dict,
    optimizer: FullOptimizerState | None,
    *,
    ep: int,
    tp: int,
    pp: int,
) -> list[Path]:
    """Write `expert_states_pp{P}_ep{r}.pt` for every stage holding experts and `0 < r < ep`,
    as the training loop's `ExpertCheckpoint.save` does; returns the files."""
    written = []
    for stage, names in enumerate(_stage_expert_names(schema, pp, tp)):
        if not names:  # a stage without MoE layers saves no expert file in training either
            continue
        for rank in range(1, ep):
            params = {n: _cut(n, state[n], ep, rank) for n in names}
            optim = {}
            if optimizer is not None:
                optim = {
                    n: {k: _cut(n, v, ep, rank) for k, v in optimizer.per_param[n].items()}
                    for n in names
                    if optimizer.per_param.get(n)
                }
            path = expert_file(folder, stage, rank)
            torch.save({"ep_size": ep, "params": params, "optimizer": optim}, path)
            written.append(path)
    return written


def read_expert_optimizer(folder: Path, ep: int, stages: int) -> list[dict[str, dict]]:
    """`{name: {state key: value}}` of expert-parallel ranks 1 .. ep-1, from the files of every
    stage that has one (stages without MoE layers have none)."""
    out = []
    for rank in range(1, ep):
        merged: dict[str, dict] = {}
        for stage in range(stages):
            path = expert_file(folder, stage, rank)
            if path.is_file():
                merged.update(load_file(path).get("optimizer") or {})
        out.append(merged)
    return out


def join_expert_optimizer(full: FullOptimizerState, folder: Path, ep: int, stages: int) -> str:
    """Complete every expert's state in `full` (rank 0's, from DeepSpeed's files) with ranks
    1 .. ep-1's, in place; returns why it cannot ("" when done)."""
    slices = read_expert_optimizer(folder, ep, stages)
    for name, values in full.per_param.items():
        if not is_expert_name(name) or not values:
            continue
        others = [s.get(name) for s in slices]
        if not all(others):
            return (
                f"the expert files of {folder} hold no optimizer state of '{name}' for every "
                "expert-parallel rank (saved without it?)"
            )
        for key, value in values.items():
            if torch.is_tensor(value) and value.dim() > 0:
                values[key] = torch.cat([value, *(o[key] for o in others)], dim=0)
    return ""
