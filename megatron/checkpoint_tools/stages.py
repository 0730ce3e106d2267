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
from dataclasses import dataclass

import torch
from deepspeed.pipe import LayerSpec, TiedLayerSpec
from deepspeed.runtime.utils import partition_balanced, partition_uniform

from megatron.checkpoint_tools.schema import TIED_PREFIX, ModelSchema
from megatron.model.specs import TIED_WEIGHTS, gpt_layer_specs


@dataclass(frozen=True)
class Entry:
    """One entry of a layer list, as DeepSpeed's partitioner and a stage's module see it."""

    name: str | None
    """What `type:REGEX` matches: the class or function name (None: the partitioner skips
    the entry)."""
    params: tuple[str, ...]
    """Full (current) names of the parameters it builds on its stage, in registration order."""
    tied: bool = False
    """A use of the tied embedding module (registered first on its stage)."""


def _entry_name(spec) -> str | None:
    if isinstance(spec, LayerSpec):
        return spec.typename.__name__
    return getattr(spec, "__name__", None)


def layer_entries(schema: ModelSchema, legacy: bool = False) -> list[Entry]:
    """The layer list of `schema`'s model (`specs.py`); with `legacy`, the list our
    checkpoints were saved with before issue 27 (`megatron/checkpoint/model_files.py`)."""
    specs = gpt_layer_specs(schema.args)
    tied = [n for n in schema.params if n.startswith(TIED_PREFIX)]
    table = [n for n in tied if n[len(TIED_PREFIX) :] in TIED_WEIGHTS]
    entries = []
    for i, spec in enumerate(specs):
        if isinstance(spec, TiedLayerSpec):  # the head builds the token table alone
            entries.append(Entry(_entry_name(spec), tuple(tied if i == 0 else table), True))
        else:
            own = tuple(n for n in schema.params if n.startswith(f"{i}."))
            entries.append(Entry(_entry_name(spec), own))
    if not legacy:
        return entries
    embedding, layers, norm, head = entries[0], entries[2:-3], entries[-2], entries[-1]
    words = tuple(n for n in embedding.params if n.endswith(tuple(TIED_WEIGHTS)))
    positions = tuple(n for n in embedding.params if n not in words)
    return [
        Entry("WordEmbeddingPipe", words, embedding.tied),
        Entry("PositionEmbeddingPipe", positions),
        *layers,
        norm,
        head if not head.tied else Entry("WordEmbeddingPipe", head.params, True),
    ]


def _weights(schema: ModelSchema, entries: list[Entry], method: str, tp: int) -> list[int]:
    if method == "parameters":
        weights = []
        for entry in entries:
            specs = [schema.params[n] for n in entry.params]
            weights.append(
                sum(
                    int(torch.Size(s.shape).numel()) // (tp if s.partition_dim is not None else 1)
                    for s in specs
                )
            )
        return weights
    pattern = re.compile(method.split(":", 1)[1], re.IGNORECASE)
    names = [entry.name for entry in entries]
    weights = [1 if name and pattern.search(name) else 0 for name in names]
    if not any(weights):
        raise ValueError(
            f"pipe_partition_method '{method}' matches no layer class "
            f"({', '.join(sorted({n for n in names if n}))})"
        )
    return weights


def stage_bounds(schema: ModelSchema, stages: int, tp: int = 1, legacy: bool = False) -> list[int]:
    """`[start_0, start_1, ..., end]`: stage `s` holds list entries `[b[s], b[s + 1])`."""
    entries = layer_entries(schema, legacy)
    method = schema.args.pipe_partition_method.lower()
    if method == "uniform":
        return [int(b) for b in partition_uniform(num_items=len(entries), num_parts=stages)]
    if method != "parameters" and not method.startswith("type:"):
        raise ValueError(
            f"pipe_partition_method '{method}' is not valid; expected 'type:REGEX', "
            "'parameters' or 'uniform'"
        )
    weights = _weights(schema, entries, method, tp)
    return [int(b) for b in partition_balanced(weights=weights, num_parts=stages)]


def stage_parameter_names(
    schema: ModelSchema, bounds: list[int], stage: int, legacy: bool = False
) -> list[str]:
    """Names of stage `stage`'s parameters in its module's `named_parameters` order: the tied
    embedding's first (the full module on the stage of its first use, the token table alone
    on a stage with only the head), then each layer's."""
    entries = layer_entries(schema, legacy)[bounds[stage] : bounds[stage + 1]]
    tied = {n for entry in entries if entry.tied for n in entry.params}
    names = [n for n in schema.params if n in tied]
    for entry in entries:
        if not entry.tied:
            names += entry.params
    return names


class StageModule(torch.nn.Module):
    """The meta model's modules holding one stage's parameters, registered in the pipeline
    stage's order (so `named_parameters` gives the stage's names and order)."""

    def __init__(self, schema: ModelSchema, bounds: list[int], stage: int, legacy: bool = False):
        super().__init__()
        meta = schema.meta_model
        for name in stage_parameter_names(schema, bounds, stage, legacy):
            path = name.rsplit(".", 1)[0]
            if not _has(self, path):
                _graft(self, path, meta.get_submodule(path))


def _has(root: torch.nn.Module, path: str) -> bool:
    try:
        root.get_submodule(path)
    except AttributeError:
        return False
    return True


def _graft(root: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    """Register `module` at dotted `path` under `root` (empty modules on the way)."""
    *parents, last = path.split(".")
    for part in parents:
        if not hasattr(root, part):
            root.add_module(part, torch.nn.Module())
        root = getattr(root, part)
    root.add_module(last, module)


def optimizer_parameter_names(
    schema: ModelSchema, bounds: list[int], stage: int, legacy: bool = False
) -> list[str]:
    """Names in the order the stage's optimizer numbers them (decay group, then no-decay),
    from the training loop's own grouping rule."""
    from megatron.model.param_groups import param_groups

    module = StageModule(schema, bounds, stage, legacy)
    names = {id(p): n for n, p in module.named_parameters()}
    order = [names[id(p)] for group in param_groups(module, 0.0) for p in group["params"]]
    expected = stage_parameter_names(schema, bounds, stage, legacy)
    if sorted(order) != sorted(expected):
        raise RuntimeError(f"stage {stage}: parameter order {order} does not cover {expected}")
    return order
