"""The model one rank of each pipeline stage holds, built on the `meta` device.

`plan_stages(args, pp, tp, ep)` builds the whole model once on `meta` (no memory, any size)
with `PlannedGroup`s standing in for the tensor- and expert-parallel groups, so every layer
has the shapes one rank of a `tp`-way (and `ep`-way) group gives it, and cuts the layer list
into `pp` stages as DeepSpeed's `PipelineModule` does: the same partition functions
(`partition_uniform`, `partition_balanced`) over the same weights (`_count_layer_params`,
`_find_layer_type`, called on our layer specs). Each `Stage` holds its entries of the layer
list and the trainable parameters its rank keeps: a tied embedding on the first and the last
stage is held, trained and stepped by both, as DeepSpeed keeps one copy per stage.

Parameters are cast to the training dtype as DeepSpeed's engine casts them (parameters only;
buffers keep their dtype).
"""

from __future__ import annotations

import dataclasses
import types

import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime import utils as ds_utils

from megatron.model.args import ModelArgs
from megatron.model.gpt import GPTModel
from megatron.model.loss import bound_loss_fn
from megatron.model.param_groups import keeps_fp32
from megatron.model.specs import gpt_layer_specs
from megatron.parallel.planned import PlannedGroup


@dataclasses.dataclass
class Entry:
    """One entry of the layer list: its index, name and the callable a stage runs."""

    index: int
    name: str
    fn: object
    module: torch.nn.Module | None


@dataclasses.dataclass
class Stage:
    """One pipeline stage as one of its ranks holds it."""

    index: int
    entries: list[Entry]
    parameters: list[torch.nn.Parameter]
    first: bool
    last: bool

    @property
    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters)


@dataclasses.dataclass
class PlannedModel:
    """The meta model, its specs, its planned groups and its stages."""

    args: ModelArgs
    model: GPTModel
    specs: list
    tp_group: PlannedGroup | None
    ep_group: PlannedGroup | None
    stages: list[Stage]


def _group(size: int, name: str) -> PlannedGroup | None:
    return PlannedGroup(size, 0, name) if size > 1 else None


def _entry_name(spec) -> str:
    if isinstance(spec, LayerSpec):
        return spec.typename.__name__
    return getattr(spec, "__name__", type(spec).__name__)


def stage_bounds(specs: list, pp: int, method: str) -> list[int]:
    """The first layer-list index of each stage, and the end: DeepSpeed's partition."""
    if pp <= 1:
        return [0, len(specs)]
    shell = types.SimpleNamespace(_layer_specs=specs)
    method = method.lower()
    if method == "uniform":
        return ds_utils.partition_uniform(num_items=len(specs), num_parts=pp)
    if method == "parameters":
        counts = PipelineModule._count_layer_params(shell)
        return ds_utils.partition_balanced(weights=counts, num_parts=pp)
    weights = [0] * len(specs)
    for index in PipelineModule._find_layer_type(shell, method.split(":", 1)[1]):
        weights[index] = 1
    return ds_utils.partition_balanced(weights=weights, num_parts=pp)


def _stage(model: GPTModel, specs: list, index: int, start: int, stop: int, pp: int) -> Stage:
    entries, params, seen = [], [], set()
    for i in range(start, stop):
        spec, fn = specs[i], model.forward_funcs[i]
        module = fn if isinstance(fn, torch.nn.Module) else None
        if isinstance(spec, TiedLayerSpec):
            module = model.tied_modules[spec.key]
        entries.append(Entry(i, _entry_name(spec), fn, module))
        for p in module.parameters() if module is not None else ():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return Stage(index, entries, params, first=index == 0, last=index == pp - 1)


def plan_stages(args: ModelArgs, pp: int, tp: int, ep: int, dtype: torch.dtype) -> PlannedModel:
    """The model of `args` as one rank of each of `pp` stages holds it (module docstring)."""
    tp_group, ep_group = _group(tp, "tensor"), _group(ep, "expert")
    plain = dataclasses.replace(args, use_mup=False, pipe_parallel_size=0)
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # layer specs seed torch
        specs = gpt_layer_specs(plain, tp_group, ep_group)
        loss_fn = bound_loss_fn(tp_group, args.z_loss, args.true_vocab_size, args.loss_chunk_tokens)
        model = GPTModel(specs, loss_fn=loss_fn)
        bounds = stage_bounds(specs, pp, args.pipe_partition_method)
    for p in model.parameters():
        if p.is_floating_point() and not keeps_fp32(p):  # Mamba's fp32 A_log, D stay fp32
            p.data = p.data.to(dtype)
    stages = max(pp, 1)
    built = [_stage(model, specs, s, bounds[s], bounds[s + 1], stages) for s in range(stages)]
    return PlannedModel(args, model, specs, tp_group, ep_group, built)
