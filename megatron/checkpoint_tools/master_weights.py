"""The fp32 master weights of a ZeRO 1-3 checkpoint, by parameter name.

With bf16 (or fp16) the module files hold the low-precision weights; the optimizer steps on
fp32 copies, which DeepSpeed saves in each data-parallel rank's optimizer file as its piece
of every parameter group's flat vector (`single_partition_of_fp32_groups`: its ZeRO 1/2
optimizer drops the group's end padding, its bf16 optimizer keeps it). The pieces of all
ranks, concatenated, are the group's flat vector in the order of the saved `param_shapes`,
each parameter followed by its alignment padding (`param_alignment_paddings`, none in the
bf16 optimizer's files): the layout `zero_state.py` reads the moments from, cut the same way.

ZeRO 3 saves each rank's `fp32_flat_groups`: every parameter cut into `ceil(numel / dp)`
pieces, rank `d` holding piece `d` of each, concatenated over the sub-groups (the layout of
its moments, and of DeepSpeed's `zero_to_fp32.py`). Its weights exist nowhere else, so
`read_zero3_shards` is how the reader gets them at tp > 1 (DeepSpeed's `zero_to_fp32.py`
reads one model-parallel rank only).

A universal checkpoint's `fp32.pt` must be these weights, not the rounded bf16 ones, so that a
resumed run continues from exactly the state the source run would have stepped from.
"""

from __future__ import annotations

import math

import torch

from megatron.checkpoint.safe_load import load_file
from megatron.checkpoint_tools.layout import CheckpointError
from megatron.checkpoint_tools.zero_state import cut_partition, optim_files, param_shapes

FP32_GROUPS = "single_partition_of_fp32_groups"
FP32_FLAT_GROUPS = "fp32_flat_groups"


def _rank_weights(saved: list[dict], shapes: list[dict], path) -> dict[str, torch.Tensor]:
    """`{name: tensor}` of one model-parallel rank from its data-parallel ranks' files."""
    if any(FP32_GROUPS not in s for s in saved):
        raise CheckpointError(f"'{path}' holds no fp32 master weights ({FP32_GROUPS})")
    paddings = saved[0].get("param_alignment_paddings")
    out = {}
    for g, group_shapes in enumerate(shapes):
        flat = torch.cat([s[FP32_GROUPS][g].detach().float().flatten() for s in saved])
        out.update(cut_partition(flat, group_shapes, paddings[g] if paddings else None))
    return out


def read_master_weights(reader) -> dict[str, torch.Tensor]:
    """Full fp32 master weights of a ZeRO 1/2 checkpoint (`reader`: its `CheckpointReader`)."""
    folder, layout, schema = reader.folder, reader.layout, reader.schema
    files = optim_files(folder)
    if sorted(files) != list(range(layout.tp * layout.stages)):
        raise CheckpointError(
            f"checkpoint '{folder}' has ZeRO optimizer files for model-parallel ranks "
            f"{sorted(files)}, expected 0..{layout.tp * layout.stages - 1}"
        )
    shards: dict[str, list[torch.Tensor]] = {}
    for mp in sorted(files):
        saved = [load_file(p)["optimizer_state_dict"] for p in files[mp]]
        if int(saved[0].get("zero_stage", 1)) == 3:
            raise CheckpointError(f"checkpoint '{folder}' is ZeRO stage 3, not 1/2")
        weights = _rank_weights(saved, param_shapes(folder, mp, 1), files[mp][0])
        for saved_name, tensor in weights.items():
            name = reader.current_name(saved_name)
            shards.setdefault(name, [])
            if len(shards[name]) < layout.tp:  # the tied embedding's copy on the last stage
                shards[name].append(tensor)
    missing = [name for name in schema.params if name not in shards]
    if missing:
        raise CheckpointError(f"checkpoint '{folder}': no fp32 master weights of {missing[:3]}")
    return {name: schema.merge(name, shards[name]) for name in schema.params}


def _stage3_weights(saved: list[dict], shapes: list[dict], path) -> dict[str, torch.Tensor]:
    """`{name: tensor}` of one model-parallel rank of a ZeRO-3 save."""
    if any(FP32_FLAT_GROUPS not in s for s in saved):
        raise CheckpointError(f"'{path}' holds no fp32 weights ({FP32_FLAT_GROUPS})")
    dp = len(saved)
    ranks = [torch.cat([t.detach().float().flatten() for t in s[FP32_FLAT_GROUPS]]) for s in saved]
    out, offset = {}, 0
    for name, shape in ((k, v) for group in shapes for k, v in group.items()):
        numel = math.prod(shape)
        piece = math.ceil(numel / dp)
        if offset + piece > ranks[0].numel():
            raise CheckpointError(f"'{path}': the ZeRO-3 partitions end before '{name}'")
        full = torch.cat([r.narrow(0, offset, piece) for r in ranks])[:numel]
        out[name] = full.view(tuple(shape)).clone()
        offset += piece
    return out


def read_zero3_shards(reader) -> list[dict[str, torch.Tensor]]:
    """Each tensor-parallel rank's fp32 weights (`{name: shard}`) of a ZeRO-3 checkpoint."""
    folder, layout = reader.folder, reader.layout
    files = optim_files(folder)
    if sorted(files) != list(range(layout.tp)):
        raise CheckpointError(
            f"checkpoint '{folder}' has ZeRO-3 optimizer files for model-parallel ranks "
            f"{sorted(files)}, expected 0..{layout.tp - 1}"
        )
    shards = []
    for mp in range(layout.tp):
        saved = [load_file(p)["optimizer_state_dict"] for p in files[mp]]
        shards.append(_stage3_weights(saved, param_shapes(folder, mp, 3), files[mp][0]))
    return shards
