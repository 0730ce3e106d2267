"""The GPT model as a list of DeepSpeed layer specs, and the parameter names that follow.

The list is GPT-NeoX's (`GPT2ModelPipe.init_specs`), index for index, because DeepSpeed names
a pipeline checkpoint's files by these indices (`layer_{index:02d}-model_{tp:02d}-...`): with
the same indices GPT-NeoX's tools read our checkpoints and we read GPT-NeoX's. With L layers:

    0          EmbeddingPipe            tokens, learned positions, dropout (TiedLayerSpec
                                        "embed" unless no_weight_tying)
    1          before_transformer_layers   a function: to (s, b, h), SP scatter (no file)
    2 .. L+1   transformer layers       (class chosen by the residual style; a layer
                                        `attention_config` makes `mamba`, `rwkv`,
                                        `gmlp` or `amlp` is that block, `BLOCK_LAYERS`)
    L+2        after_transformer_layers    a function: drops the position ids (no file)
    L+3        FinalNormPipe
    L+4        OutputHeadPipe, or the tied "embed" module's `project_to_vocab` (no file: the
               table is saved once, in layer 0's); for a reward model (`args.value_head`)
               always ValueHeadPipe (the embedding keeps its name, tied or not, so a
               language model's checkpoint names still fit)

The two functions are plain callables, not modules, so DeepSpeed writes no file for them, as
for GPT-NeoX's `_pre_transformer_block` and `_post_transformer_block`. Their names contain
"transformer", as those do: DeepSpeed's `type:REGEX` partitioner matches the callables' names,
so under GPT-NeoX's default `type:transformer|mlp` the stages hold the same layers as a
GPT-NeoX run's (its optimizer state then fits ours stage for stage).

Parameter names are DeepSpeed's `PipelineModule` names, and the plain `GPTModel` uses the same:
`{index}.{name inside the layer}`, except the tied embedding, which is
`tied_modules.embed.{name}` (`layer_prefix` gives the prefix of each part).

Every spec builds its layer under `torch.manual_seed(seed + index)` (the tied head reuses the
embedding's seed), so the full weights depend on the seed only, not on how layers are split
over pipeline stages or tensor-parallel ranks.
"""

from __future__ import annotations

import functools

import torch
from deepspeed.pipe import LayerSpec, TiedLayerSpec

from megatron.model.args import ModelArgs
from megatron.model.embedding import (
    EmbeddingPipe,
    WordEmbeddingPipe,
    project_to_vocab,
    to_transformer_layout,
)
from megatron.model.gmlp import GMLPTransformerLayer
from megatron.model.head import FinalNormPipe, OutputHeadPipe, ValueHeadPipe
from megatron.model.mamba import MambaTransformerLayer
from megatron.model.rwkv import RWKVTransformerLayer
from megatron.model.transformer import TRANSFORMER_LAYERS, transformer_layer_class

EMBED_KEY = "embed"
TIED_WEIGHTS = ["word_embeddings.weight"]
# Layers that replace a whole transformer layer, by their `attention_config` type.
BLOCK_LAYERS = {
    "mamba": MambaTransformerLayer,
    "rwkv": RWKVTransformerLayer,
    "gmlp": GMLPTransformerLayer,
    "amlp": GMLPTransformerLayer,
}
TRANSFORMER_LAYER_NAMES = sorted(
    {cls.__name__ for cls in (*TRANSFORMER_LAYERS.values(), *BLOCK_LAYERS.values())}
)
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


class LayerFunction:
    """A parameter-free entry of the layer list: a callable that is not an `nn.Module`, so
    DeepSpeed neither registers nor saves it. `__name__` is what its `type:REGEX`
    partitioner matches (see the module docstring)."""

    def __init__(self, name: str, fn, **kwargs):
        self.__name__ = name
        self._fn = functools.partial(fn, **kwargs) if kwargs else fn

    def __call__(self, inputs):
        return self._fn(inputs)

    def __repr__(self) -> str:
        return f"LayerFunction({self.__name__})"


def drop_position_ids(inputs):
    """`(hidden, position_ids) -> hidden`: nothing after the transformer layers needs them."""
    hidden, _ = inputs
    return hidden


def layer_index(args: ModelArgs, part: str, layer: int = 0) -> int:
    """Index in the spec list of `part`: embedding, layer (0-based `layer`), final_norm or
    head."""
    indices = {
        "embedding": 0,
        "layer": 2 + layer,
        "final_norm": args.num_layers + 3,
        "head": args.num_layers + 4,
    }
    return indices[part]


def layer_prefix(args: ModelArgs, part: str, layer: int = 0) -> str:
    """Parameter-name prefix of `part` (see the module docstring), e.g. `"5."`."""
    if part == "head" and args.value_head:
        return f"{layer_index(args, part)}."
    if part in ("embedding", "head") and args.tied_embeddings:
        return f"tied_modules.{EMBED_KEY}."
    return f"{layer_index(args, part, layer)}."


def gpt_layer_specs(args: ModelArgs, tp_group=None, ep_group=None) -> list:
    """The spec list of the table above (`ep_group`: the expert-parallel group of MoE
    layers)."""
    seed = args.seed
    head_seed = seed + layer_index(args, "head")
    if args.tied_embeddings:
        embedding = SeededTiedLayerSpec(
            seed, EMBED_KEY, EmbeddingPipe, args, tp_group, tied_weight_attr=TIED_WEIGHTS
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
        embedding = SeededLayerSpec(seed, EmbeddingPipe, args, tp_group)
        head = SeededLayerSpec(head_seed, OutputHeadPipe, args, tp_group)
    if args.value_head:
        head = SeededLayerSpec(head_seed, ValueHeadPipe, args, tp_group)
    layer_cls = transformer_layer_class(args)
    before = LayerFunction(
        "before_transformer_layers",
        to_transformer_layout,
        tp_group=tp_group,
        sequence_parallel=args.sequence_parallel,
    )
    specs: list = [embedding, before]
    for i in range(args.num_layers):
        layer_seed = seed + layer_index(args, "layer", i)
        cls = BLOCK_LAYERS.get(args.attention_type(i), layer_cls)
        specs.append(SeededLayerSpec(layer_seed, cls, args, i, tp_group, ep_group))
    specs.append(LayerFunction("after_transformer_layers", drop_position_ids))
    norm_seed = seed + layer_index(args, "final_norm")
    specs.append(SeededLayerSpec(norm_seed, FinalNormPipe, args, tp_group))
    specs.append(head)
    return specs


def saved_layers(specs: list) -> list[int]:
    """Indices of the layers DeepSpeed's pipeline engine writes a file for: every module,
    except a tied module's second use (its table is saved with the first)."""
    seen: set[str] = set()
    out = []
    for index, spec in enumerate(specs):
        if isinstance(spec, TiedLayerSpec):
            if spec.key in seen:
                continue
            seen.add(spec.key)
        if isinstance(spec, LayerSpec):
            out.append(index)
    return out
