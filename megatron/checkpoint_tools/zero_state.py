"""Optimizer state of a ZeRO stage 1, 2 or 3 checkpoint, by parameter name, full tensors.

DeepSpeed's ZeRO optimizers save one `zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt` per
data-parallel rank `d` and model-parallel rank `m`; its `optimizer_state_dict` holds flat
partitions over the data-parallel ranks of that model-parallel rank's parameters:

- ZeRO 1/2: each parameter group is one flat vector (the parameters in the order of the
  saved `param_shapes`, each followed by its alignment padding `param_alignment_paddings`,
  the group padded at its end), cut into `partition_count` contiguous pieces. The torch
  optimizer's state (`base_optimizer_state`: `exp_avg`, `exp_avg_sq`, `step`, ...) is
  indexed by group and holds this rank's piece, end padding included (`group_paddings`).
- ZeRO 3: every parameter is cut into `ceil(numel / dp)` pieces and rank `d` holds piece `d`
  of each, concatenated over the sub-groups; the torch state (`optimizer_state_dict`) is
  indexed by sub-group.

This is the reconstruction of DeepSpeed's own `zero_to_fp32.py` (which rebuilds the fp32
master weights) applied to every tensor of the optimizer state, so the moments come back
next to the weights. DeepSpeed's `ds_to_universal.py` does the same but needs the
`universal_checkpoint_info` that Megatron-DeepSpeed models save and ours do not, so it is
not called (see `reshard.py`).

`read_zero_optimizer_state` returns the layout-free `FullOptimizerState` the ZeRO-0 writer
re-splits (`optimizer_state.py`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from megatron.checkpoint.deepspeed_files import ZERO_OPTIM_FILE, mp_rank_file, zero_model_file
from megatron.checkpoint.safe_load import load_file
from megatron.checkpoint_tools.layout import CheckpointError
from megatron.checkpoint_tools.optimizer_state import FullOptimizerState
from megatron.model.neox_names import reordered_by_neox


def optim_files(folder: Path) -> dict[int, list[Path]]:
    """`{mp rank: [file of dp rank 0, 1, ...]}`."""
    found: dict[int, dict[int, Path]] = {}
    for path in folder.iterdir():
        if match := ZERO_OPTIM_FILE.match(path.name):
            found.setdefault(int(match.group(2)), {})[int(match.group(1))] = path
    out = {}
    for mp, by_dp in found.items():
        if sorted(by_dp) != list(range(len(by_dp))):
            raise CheckpointError(
                f"checkpoint '{folder}': ZeRO files of model-parallel rank {mp} exist for "
                f"data-parallel ranks {sorted(by_dp)}; the folder is incomplete"
            )
        out[mp] = [by_dp[d] for d in range(len(by_dp))]
    return out


def param_shapes(folder: Path, mp: int, stage: int) -> list[dict]:
    """DeepSpeed's `param_shapes` (one ordered {name: shape} per group) of rank `mp`."""
    name = zero_model_file(mp) if stage == 3 else mp_rank_file(mp)
    shapes = load_file(folder / name).get("param_shapes")
    if not shapes:
        raise CheckpointError(f"'{folder / name}' has no param_shapes; it is not a ZeRO save")
    return shapes if isinstance(shapes, list) else [shapes]


def cut_partition(flat: torch.Tensor, shapes: dict, paddings=None) -> dict[str, torch.Tensor]:
    """One flat group `flat` cut into its parameters `{name: tensor of its shape}` (`shapes`
    in order; `paddings`: the alignment padding after each parameter, skipped)."""
    out, offset = {}, 0
    for i, (name, shape) in enumerate(shapes.items()):
        numel = math.prod(shape)
        out[name] = flat.narrow(0, offset, numel).view(tuple(shape)).clone()
        offset += numel + (paddings[i] if paddings else 0)
    if offset > flat.numel():
        raise CheckpointError(f"ZeRO partitions hold {flat.numel()} values, need {offset}")
    return out


def _stage12(files: list[dict], shapes: list[dict]) -> tuple[dict, list]:
    """Per-parameter state of one model-parallel rank from its ZeRO 1/2 files."""
    per_param: dict[str, dict] = {}
    groups = files[0]["base_optimizer_state"]["param_groups"]
    paddings = files[0].get("param_alignment_paddings")
    for g, group_shapes in enumerate(shapes):
        states = [f["base_optimizer_state"]["state"].get(g, {}) for f in files]
        for key, value in states[0].items():
            if torch.is_tensor(value) and value.dim() > 0:
                pieces = [
                    s[key][: s[key].numel() - f["group_paddings"][g]] for s, f in zip(states, files)
                ]
                cut = cut_partition(
                    torch.cat(pieces), group_shapes, paddings[g] if paddings else None
                )
                for name, tensor in cut.items():
                    per_param.setdefault(name, {})[key] = tensor
            else:  # step and other scalars: one per group, the same for its parameters
                for name in group_shapes:
                    per_param.setdefault(name, {})[key] = value
    return per_param, groups


def _stage3(files: list[dict], shapes: list[dict]) -> tuple[dict, list]:
    """Per-parameter state of one model-parallel rank from its ZeRO 3 files."""
    dp = len(files)
    flat_shapes = {k: v for group in shapes for k, v in group.items()}
    torch_states = [f["optimizer_state_dict"] for f in files]
    per_param: dict[str, dict] = {}
    sub_groups = sorted(torch_states[0]["state"])
    sample = torch_states[0]["state"][sub_groups[0]]
    for key, value in sample.items():
        if not (torch.is_tensor(value) and value.dim() > 0):
            for name in flat_shapes:
                per_param.setdefault(name, {})[key] = value
            continue
        ranks = [torch.cat([s["state"][i][key] for i in sub_groups]) for s in torch_states]
        offset = 0
        for name, shape in flat_shapes.items():
            numel = math.prod(shape)
            piece = math.ceil(numel / dp)
            full = torch.cat([r.narrow(0, offset, piece) for r in ranks])[:numel]
            per_param.setdefault(name, {})[key] = full.view(tuple(shape)).clone()
            offset += piece
    return per_param, torch_states[0]["param_groups"]


def read_zero_optimizer_state(reader) -> tuple[FullOptimizerState | None, str]:
    """`(state, "")` of a ZeRO 1-3 checkpoint of an elementwise optimizer
    (`optimizer_read.unmovable_reason`, checked by the caller)."""
    folder, layout, schema = reader.folder, reader.layout, reader.schema
    files = optim_files(folder)
    mp_ranks = layout.tp * layout.stages
    if sorted(files) != list(range(mp_ranks)):
        raise CheckpointError(
            f"checkpoint '{folder}' has ZeRO optimizer files for model-parallel ranks "
            f"{sorted(files)}, expected 0..{mp_ranks - 1}"
        )
    full = FullOptimizerState()
    shards: dict[str, list] = {}
    for mp in range(mp_ranks):
        saved = [load_file(p)["optimizer_state_dict"] for p in files[mp]]
        stage = int(saved[0].get("zero_stage", 1))  # DeepSpeed's bf16 optimizer: ZeRO-1
        shapes = param_shapes(folder, mp, stage)
        if why := reordered_by_neox((n for group in shapes for n in group), reader.args):
            return None, (
                f"{folder / mp_rank_file(mp)} names GPT-NeoX's {why}: the tools cut or reorder "
                "such weights as the model holds them, not their optimizer state"
            )
        per_param, groups = (_stage3 if stage == 3 else _stage12)(saved, shapes)
        for group in groups:
            hyper = {k: v for k, v in group.items() if k != "params"}
            full.groups.setdefault(str(group.get("name")), hyper)
        for saved_name, state in per_param.items():
            name = reader.current_name(saved_name)
            shards.setdefault(name, [])
            if len(shards[name]) < layout.tp:  # the tied embedding's copy on the last stage
                shards[name].append(state)
    for name in schema.params:
        if name not in shards:
            raise CheckpointError(
                f"checkpoint '{folder}': no optimizer state of '{name}'; its ZeRO partitions "
                f"hold {len(shards)} parameters, named as {sorted(shards)[:3]} in the model's "
                "names (does the config describe the run that saved it?)"
            )
        states = shards[name]
        merged = {}
        for key, value in states[0].items():
            tensor = torch.is_tensor(value) and value.dim() > 0
            merged[key] = schema.merge(name, [s[key] for s in states]) if tensor else value
        full.per_param[name] = merged
    return full, ""
