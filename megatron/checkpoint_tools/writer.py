"""Write full weights as a checkpoint of any tp/pp layout that `pretrain` loads (no engine).

The files are those DeepSpeed's engine writes (`layout.py`), so `load` + `finetune: true`
(weights only) or a plain resume (weights, optimizer when given, iteration and schedule from
`trainer_state.pt`) reads them at that layout:

- pipeline (`pp >= 1`): `layer_{i:02d}-model_{t:02d}-model_states.pt` for every layer the
  engine saves (`specs.py::saved_layers`: GPT-NeoX's indices) and tensor-parallel rank, and
  `mp_rank_{s * tp + t:02d}_model_states.pt` (engine state, `module: None`, the optimizer
  state of stage `s`, rank `t`, and GPT-NeoX's `iteration` and `args`);
- plain (`pp == 0`): `mp_rank_{t:02d}_model_states.pt` with rank `t`'s `module` state dict,
  in GPT-NeoX's sequential names (`megatron/checkpoint/neox_layout.py`);

then `config.json`, `trainer_state.pt`, and `{save}/latest` (atomically, last). Per-rank RNG
states are not written: they belong to the old ranks (`pretrain` then warns and goes on).

At expert-parallel size `ep > 1` DeepSpeed's files get expert-parallel rank 0's experts (and
their optimizer state) and `expert_states_pp{P}_ep{r}.pt` the others', as training saves them
(`experts.py`); `config_dict` must then say `moe_expert_parallel_size: ep`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import deepspeed
import torch

from megatron.checkpoint.deepspeed_files import layer_file, mp_rank_file
from megatron.checkpoint.folders import (
    CONFIG_FILE,
    TRAINER_STATE,
    mark_complete,
    tag_for,
    write_latest,
)
from megatron.checkpoint.neox_layout import config_json, neox_entries, to_sequential
from megatron.checkpoint_tools.experts import (
    check_expert_parallel,
    expert_files,
    optimizer_slice,
    rank_slice,
)
from megatron.checkpoint_tools.layout import CheckpointError
from megatron.checkpoint_tools.optimizer_state import FullOptimizerState, shard_optimizer_state
from megatron.checkpoint_tools.schema import ModelSchema
from megatron.model.specs import gpt_layer_specs, saved_layers


def _check_state(schema: ModelSchema, state: dict) -> None:
    missing = [name for name in schema.params if name not in state]
    if missing:
        raise CheckpointError(f"cannot write the checkpoint: no tensor for {missing[:4]}")
    for name, spec in schema.params.items():
        if tuple(state[name].shape) != spec.shape:
            raise CheckpointError(
                f"cannot write '{name}': tensor {tuple(state[name].shape)}, the model needs "
                f"{spec.shape}"
            )


def _engine_state(engine: dict | None, iteration: int, tp: int, pp: int) -> dict:
    """DeepSpeed's per-rank bookkeeping, carried over from `engine` (a source mp_rank file)."""
    engine = engine or {}
    return {
        "buffer_names": [],
        "param_shapes": None,
        "frozen_param_shapes": None,
        "shared_params": None,
        "frozen_param_fragments": None,
        "lr_scheduler": engine.get("lr_scheduler"),
        "data_sampler": None,
        "random_ltd": None,
        "skipped_steps": engine.get("skipped_steps", 0),
        "global_steps": iteration,
        "global_samples": engine.get("global_samples", 0),
        "dp_world_size": engine.get("dp_world_size", 1),
        "mp_world_size": tp * max(1, pp),
        "checkpoint_parallel_dimensions": {"pp_degree": max(1, pp), "tp_degree": tp},
        "ds_config": engine.get("ds_config"),
        "ds_version": deepspeed.__version__,
    }


def _prepare_folder(save_dir: Path, tag: str, overwrite: bool) -> Path:
    folder = save_dir / tag
    if folder.exists() and any(folder.iterdir()):
        if not overwrite:
            raise CheckpointError(
                f"'{folder}' already exists; choose another output folder or overwrite it"
            )
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_checkpoint(
    save_dir: str | Path,
    *,
    schema: ModelSchema,
    state: dict[str, torch.Tensor],
    tp: int,
    pp: int,
    iteration: int,
    config_dict: dict,
    optimizer: FullOptimizerState | None = None,
    engine_state: dict | None = None,
    trainer_state: dict | None = None,
    overwrite: bool = False,
    more_files: Callable[[Path], object] | None = None,
    ep: int = 1,
) -> Path:
    """Write `state` (full tensors named as the model names them) at layout (tp, pp).

    `engine_state` is a source `mp_rank` file's content (scheduler, sample counts, DeepSpeed
    config) to carry over; `trainer_state` becomes `trainer_state.pt` (default: iteration
    only); `more_files(folder)` writes further files before the folder is marked complete
    (DeepSpeed's universal layout, `universal.py`); `ep` is the expert-parallel size (module
    docstring). Returns the `global_step{iteration}` folder.
    """
    schema.check_tp(tp)
    check_expert_parallel(schema, ep)
    saved_ep = int(config_dict.get("moe_expert_parallel_size", 1) or 1)
    if saved_ep != ep:
        raise CheckpointError(
            f"the config to record says moe_expert_parallel_size {saved_ep}, the files are "
            f"written for {ep}: they must agree (the loader reads it from config.json)"
        )
    _check_state(schema, state)
    full_state, full_optimizer = state, optimizer
    state, optimizer = rank_slice(state, ep, 0), optimizer_slice(optimizer, ep, 0)
    save_dir = Path(save_dir)
    tag = tag_for(iteration)
    folder = _prepare_folder(save_dir, tag, overwrite)
    stages = max(1, pp)
    if pp >= 1:
        for layer in saved_layers(gpt_layer_specs(schema.args)):
            params = schema.layer_params(layer)
            for t in range(tp):
                shard = {s.local: schema.shard(s.name, state[s.name], tp, t) for s in params}
                torch.save(shard, folder / layer_file(layer, t))
    for stage in range(stages):
        for t in range(tp):
            ranked = _engine_state(engine_state, iteration, tp, pp)
            ranked.update(neox_entries(config_dict, iteration))  # what GPT-NeoX's loader reads
            ranked["module"] = None
            if pp == 0:
                ranked["module"] = to_sequential(
                    {name: schema.shard(name, state[name], tp, t) for name in schema.params}
                )
            ranked["optimizer"] = (
                shard_optimizer_state(optimizer, schema, stage, stages, tp, t)
                if optimizer is not None
                else None
            )
            torch.save(ranked, folder / mp_rank_file(stage * tp + t))
    torch.save({**(trainer_state or {}), "iteration": iteration}, folder / TRAINER_STATE)
    (folder / CONFIG_FILE).write_text(config_json(config_dict))
    if ep > 1:
        expert_files(folder, schema, full_state, full_optimizer, ep=ep, tp=tp, pp=pp)
    if more_files is not None:
        more_files(folder)
    mark_complete(folder, tag)
    write_latest(save_dir, tag)
    return folder
