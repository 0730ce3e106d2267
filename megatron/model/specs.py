"""The GPT model as a list of DeepSpeed layer specs, and the parameter names that follow.

Layer list (index: layer):

    0          WordEmbeddingPipe       (TiedLayerSpec "embed" unless no_weight_tying)
    1          PositionEmbeddingPipe   (input positions, (b, s, h) -> (s, b, h), dropout)
    2 .. L+1   transformer layers      (class chosen by the residual style)
    L+2        FinalNormPipe
    L+3        OutputHeadPipe, or the tied "embed" module's `project_to_vocab`; for a reward
               model (`args.value_head`) always ValueHeadPipe (the embedding keeps its name,
               tied or not, so a language model's checkpoint names still fit)

Parameter names are DeepSpeed's `PipelineModule` names, and the plain `GPTModel` uses the same:
`{index}.{name inside the layer}`, except the tied embedding, which is
`tied_modules.embed.word_embeddings.weight` (`layer_prefix` gives the prefix of each part).

Every spec builds its layer under `torch.manual_seed(seed + index)` (the tied head reuses the
embedding's seed), so the full weights depend on the seed only, not on how layers are split
over pipeline stages or tensor-parallel ranks.
"""

from __future__ import annotations

import torch
from deepspeed.pipe import LayerSpec, TiedLayerSpec

from megatron.model.args import ModelArgs
from megatron.model.embedding import PositionEmbeddingPipe, WordEmbeddingPipe, project_to_vocab
from megatron.model.head import FinalNormPipe, OutputHeadPipe, ValueHeadPipe
from megatron.model.transformer import TRANSFORMER_LAYERS, transformer_layer_class

EMBED_KEY = "embed"
TIED_WEIGHTS = ["word_embeddings.weight"]
TRANSFORMER_LAYER_NAMES = sorted({cls.__name__ for cls in TRANSFORMER_LAYERS.values()})
"""Class names of the transformer layers: the layers DeepSpeed may checkpoint."""


class SeededLayerSpec(LayerSpec):
    """A `LayerSpec` whose layer is built from `torch.manual_seed(seed)` (CPU RNG forked)."""

    def __init__(self, seed: int, typename, *module_args, **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.seed = seed

    def build(self, log=False):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return super().build(log=log)


class SeededTiedLayerSpec(TiedLayerSpec):
    """A `TiedLayerSpec` built like `SeededLayerSpec`."""

    def __init__(self, seed: int, key: str, typename, *module_args, **module_kwargs):
        super().__init__(key, typename, *module_args, **module_kwargs)
        self.seed = seed

    def build(self, log=False):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return super().build(log=log)


def layer_index(args: ModelArgs, part: str, layer: int = 0) -> int:
    """Index in the spec list of `part`: embedding, position, layer (0-based `layer`),
    final_norm or head."""
    indices = {
        "embedding": 0,
        "position": 1,
        "layer": 2 + layer,
        "final_norm": args.num_layers + 2,
        "head": args.num_layers + 3,
    }
    return indices[part]


def layer_prefix(args: ModelArgs, part: str, layer: int = 0) -> str:
    """Parameter-name prefix of `part` (see the module docstring), e.g. `"5."`."""
    if part == "head" and args.value_head:
        return f"{layer_index(args, part)}."
    if part in ("embedding", "head") and args.tied_embeddings:
        return f"tied_modules.{EMBED_KEY}."
    return f"{layer_index(args, part, layer)}."


def gpt_layer_specs(args: ModelArgs, tp_group=None, ep_group=None) -> list[LayerSpec]:
    """The spec list of the table above (`ep_group`: the expert-parallel group of MoE
    layers)."""
    seed = args.seed
    if args.tied_embeddings:
        embedding = SeededTiedLayerSpec(
            seed, EMBED_KEY, WordEmbeddingPipe, args, tp_group, tied_weight_attr=TIED_WEIGHTS
        )
        head = SeededTiedLayerSpec(
            seed,
            EMBED_KEY,
            WordEmbeddingPipe,
            args,
            tp_group,
            forward_fn=project_to_vocab,
            tied_weight_attr=TIED_WEIGHTS,
        )
    else:
        embedding = SeededLayerSpec(seed, WordEmbeddingPipe, args, tp_group)
        head = SeededLayerSpec(seed + layer_index(args, "head"), OutputHeadPipe, args, tp_group)
    if args.value_head:
        head = SeededLayerSpec(seed + layer_index(args, "head"), ValueHeadPipe, args, tp_group)
    layer_cls = transformer_layer_class(args)
    specs = [
        embedding,
        SeededLayerSpec(seed + 1, PositionEmbeddingPipe, args, tp_group),
    ]
    for i in range(args.num_layers):
        layer_seed = seed + layer_index(args, "layer", i)
        specs.append(SeededLayerSpec(layer_seed, layer_cls, args, i, tp_group, ep_group))
    specs.append(
        SeededLayerSpec(seed + layer_index(args, "final_norm"), FinalNormPipe, args, tp_group)
    )
    specs.append(head)
    return specs
