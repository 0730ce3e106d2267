"""Which layers each pipeline stage holds, and the order its optimizer numbers the parameters.

A torch optimizer's state dict numbers parameters 0, 1, ... across its parameter groups; to move
that state between layouts each number must become a name. On a pipeline stage the optimizer was
built over the stage's `PipelineModule` (`megatron/model/param_groups.py`), whose parameters come in
registration order: the tied embedding module first when the stage holds a tied layer, then its
layers by index.

The layers of a stage follow DeepSpeed's `PipelineModule._partition_layers`, computed here with
the same DeepSpeed partition functions over the same weights (`uniform`: one per entry of the
layer list; `parameters`: this tensor-parallel rank's parameter count of each layer, 0 for the
parameter-free functions; `type:REGEX`: 1 for entries whose class name, or function name,
matches, case-insensitively).

A tied embedding is built on each stage that uses it: in full (`EmbeddingPipe`, with any
learned position table) on the stage of layer 0, as the token table alone (`WordEmbeddingPipe`)
on a later stage that holds only the tied head (`specs.py`).
"""

from __future__ import annotations

import re

import torch
from deepspeed.pipe import LayerSpec, TiedLayerSpec
from deepspeed.runtime.utils import partition_balanced, partition_uniform

from megatron.checkpoint_tools.schema import TIED_PREFIX, ModelSchema
from megatron.model.specs import EMBED_KEY, TIED_WEIGHTS, gpt_layer_specs


def _entry_name(spec) -> str | None:
    """The name DeepSpeed's `type:REGEX` partitioner matches (None: it skips the entry)."""
    if isinstance(spec, LayerSpec):
        return spec.typename.__name__
    return getattr(spec, "__name__", None)


def tied_names(schema: ModelSchema, bounds: list[int], stage: int) -> list[str]:
    """The tied embedding's parameters built on stage `stage` (module docstring)."""
    specs = gpt_layer_specs(schema.args)
    start, stop = bounds[stage], bounds[stage + 1]
    if not any(isinstance(specs[i], TiedLayerSpec) for i in range(start, stop)):
        return []
    names = [n for n in schema.params if n.startswith(TIED_PREFIX)]
    if start > 0:  # only the tied head here: the token table alone
        names = [n for n in names if n[len(TIED_PREFIX) :] in TIED_WEIGHTS]
    return names


def _layer_weights(schema: ModelSchema, specs: list, method: str, tp: int) -> list[int]:
    if method == "parameters":
        per_layer = [0] * len(specs)
        for spec in schema.params.values():
            numel = int(torch.Size(spec.shape).numel())
            per_layer[spec.layer] += numel // tp if spec.partition_dim is not None else numel
        head = len(specs) - 1
        if isinstance(specs[head], TiedLayerSpec):  # the tied head builds the table alone
            table = schema.params[TIED_PREFIX + TIED_WEIGHTS[0]]
            per_layer[head] = int(torch.Size(table.shape).numel()) // tp
        return per_layer
    pattern = re.compile(method.split(":", 1)[1], re.IGNORECASE)
    names = [_entry_name(spec) for spec in specs]
    weights = [1 if name and pattern.search(name) else 0 for name in names]
    if not any(weights):
        raise ValueError(
            f"pipe_partition_method '{method}' matches no layer class "
            f"({', '.join(sorted({n for n in names if n}))})"
        )
    return weights


def stage_bounds(schema: ModelSchema, stages: int, tp: int = 1) -> list[int]:
    """`[start_0, start_1, ..., end]`: stage `s` holds spec layers `[b[s], b[s + 1])`."""
    specs = gpt_layer_specs(schema.args)
    method = schema.args.pipe_partition_method.lower()
    if method == "uniform":
        return [int(b) for b in partition_uniform(num_items=len(specs), num_parts=stages)]
    if method != "parameters" and not method.startswith("type:"):
        raise ValueError(
            f"pipe_partition_method '{method}' is not valid; expected 'type:REGEX', "
            "'parameters' or 'uniform'"
        )
    weights = _layer_weights(schema, specs, method, tp)
    return [int(b) for b in partition_balanced(weights=weights, num_parts=stages)]


def stage_parameter_names(schema: ModelSchema, bounds: list[int], stage: int) -> list[str]:
    """Names of stage `stage`'s parameters in its module's `named_parameters` order."""
    specs = gpt_layer_specs(schema.args)
    start, stop = bounds[stage], bounds[stage + 1]
    names = tied_names(schema, bounds, stage)
    for i in range(start, stop):
        if not isinstance(specs[i], TiedLayerSpec):
            names += [n for n in schema.params if n.startswith(f"{i}.")]
    return names


def _graft(root: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    """Register `module` at dotted `path` under `root` (empty modules on the way)."""
    *parents, last = path.split(".")
    for part in parents:
        if not hasattr(root, part):
            root.add_module(part, torch.nn.Module())
        root = getattr(root, part)
    root.add_module(last, module)


class StageModule(torch.nn.Module):
    """The meta model's modules of one stage, registered in the pipeline stage's order."""

    def __init__(self, schema: ModelSchema, bounds: list[int], stage: int):
        super().__init__()
        specs = gpt_layer_specs(schema.args)
        meta = schema.meta_model
        start, stop = bounds[stage], bounds[stage + 1]
        tied = tied_names(schema, bounds, stage)
        if tied:  # the stage's own copy: the full module, or its token table alone
            copy = torch.nn.ModuleDict({EMBED_KEY: torch.nn.Module()})
            module = meta.tied_modules[EMBED_KEY]
            for name in tied:
                path = name[len(TIED_PREFIX) :].rsplit(".", 1)[0]
                _graft(copy[EMBED_KEY], path, module.get_submodule(path))
            self.tied_modules = copy
        for i in range(start, stop):
            if not isinstance(specs[i], TiedLayerSpec) and hasattr(meta, str(i)):
                self.add_module(str(i), getattr(meta, str(i)))


def optimizer_parameter_names(schema: ModelSchema, bounds: list[int], stage: int) -> list[str]:
    """Names in the order the stage's optimizer numbers them (decay group, then no-decay),
    from the training loop's own grouping rule."""
    from megatron.model.param_groups import param_groups

    module = StageModule(schema, bounds, stage)
    names = {id(p): n for n, p in module.named_parameters()}
    order = [names[id(p)] for group in param_groups(module, 0.0) for p in group["params"]]
    expected = stage_parameter_names(schema, bounds, stage)
    if sorted(order) != sorted(expected):
        raise RuntimeError(f"stage {stage}: parameter order {order} does not cover {expected}")
    return order
