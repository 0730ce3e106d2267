"""`ModelArgs`: every setting the model reads, and its config adapter.

The model code takes a `ModelArgs`, never the whole config, so tests and tools build models
without loading or resolving a config file. Its fields are not written here: they are the
config groups' own fields, with the same names, types and defaults, so each is defined once:
every field of `ModelConfig` (`megatron/config/groups/model.py`) except the few in `CONFIG_ONLY`,
and the keys of other groups named in `OTHER_GROUPS` (pipeline layout, sequence parallelism,
seed). A new model key is added to `ModelConfig` only and reaches the model as `args.<key>`.
Only values the model reads in another form than the config states are declared here
(`vocab_size`, `softmax_fusion`, `value_head`).

`ModelArgs(num_layers=..., hidden_size=..., num_attention_heads=..., vocab_size=...,
seq_length=..., **other_keys)` takes keyword arguments only. `ModelArgs.from_config(cfg)` reads
a resolved config's `model`, `parallel` and `training` groups (duck-typed: a
`types.SimpleNamespace` with those attributes works too; a missing attribute keeps the default).
"""

from __future__ import annotations

import dataclasses
import difflib

from megatron.config.groups.model import BLOCK_LAYER_TYPES, ModelConfig, heads_split_hidden
from megatron.config.groups.moe import MoEConfig
from megatron.config.groups.mup import MUP_MODEL_KEYS, MuPConfig
from megatron.config.groups.parallel import ParallelConfig
from megatron.config.groups.training import TrainingConfig
from megatron.config.schema import field_types

# `ModelConfig` keys the model reads in another form (the value: the ModelArgs field).
CONFIG_ONLY = {
    "attention_config": "layer_attention_types",  # expanded per layer at resolution
    "scaled_upper_triang_masked_softmax_fusion": "softmax_fusion",
    "scaled_masked_softmax_fusion": "softmax_fusion",
    "padded_vocab_size": "vocab_size",
}
# Keys of other groups that the model reads, by the group's attribute name on the config.
OTHER_GROUPS = {
    "parallel": (
        ParallelConfig,
        ("pipe_parallel_size", "pipe_partition_method", "sequence_parallel"),
    ),
    "training": (TrainingConfig, ("seed",)),
    "moe": (MoEConfig, tuple(f.name for f in dataclasses.fields(MoEConfig))),
    "mup": (MuPConfig, MUP_MODEL_KEYS),
}
# Keys that are null in a config until set, and without which no model can be built.
REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")


def _config_fields() -> tuple[list[tuple], dict[str, str]]:
    """The ModelArgs fields taken from the config groups, and each one's group attribute."""
    sources = [("model", ModelConfig, None), *((g, c, n) for g, (c, n) in OTHER_GROUPS.items())]
    specs, group_of = [], {}
    for group, cls, names in sources:
        types = field_types(cls)
        for f in dataclasses.fields(cls):
            if f.name in CONFIG_ONLY or (names is not None and f.name not in names):
                continue
            if f.name in REQUIRED:
                specs.append((f.name, types[f.name]))
            else:
                specs.append((f.name, types[f.name], dataclasses.field(default=f.default)))
            group_of[f.name] = group
    return specs, group_of


_CONFIG_FIELDS, _GROUP_OF = _config_fields()

VALUE_HEAD_TRAIN_IMPL = "rm"
"""The `train_impl` whose model ends in a value head (one scalar per token)."""


def _train_impl(cfg) -> str:
    """The config's `train_impl` (`cfg.post_training`), `normal` when the config has none."""
    return getattr(getattr(cfg, "post_training", None), "train_impl", None) or "normal"


_DOC = """Architecture and model-side parallel settings of one GPT model.

Beyond the config keys (see the module docstring): `vocab_size` is the padded vocabulary (rows
of the embedding and the output head, divisible by the tensor-parallel size), of which the
first `true_vocab_size` are tokens (None: all of them; the loss masks the others out);
`softmax_fusion`
says that `global` layers use the fused scale-mask-softmax path (the kernel where available);
`value_head` ends the model in a reward model's value head (`train_impl: rm`, see
`megatron/model/head.py`) instead of the vocabulary projection; an empty
`layer_attention_types` means all `global`; a null `head_dim` is resolved to
`hidden_size / num_attention_heads` when the args are made. Layer `i` of the spec list is
initialised from `seed + i`, so one seed gives the same full model at any tensor/pipeline layout.
"""


class _ModelArgsMethods:
    """Validation, derived values and the config adapter of `ModelArgs` (its base class)."""

    def __post_init__(self):
        for key in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model {key} must be a positive integer, got {value!r}")
        if self.true_vocab_size is not None and not 0 < self.true_vocab_size <= self.vocab_size:
            raise ValueError(
                f"model true_vocab_size {self.true_vocab_size!r} (the tokenizer's) must be in "
                f"1..{self.vocab_size}, the padded vocabulary"
            )
        split = heads_split_hidden(self.layer_attention_types)
        if self.head_dim is None and self.hidden_size % self.num_attention_heads and split:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not divisible by "
                f"num_kv_heads {self.kv_heads}; num_kv_heads must divide it"
            )
        if self.head_dim is None:  # resolved once: hidden_size / num_attention_heads
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.checkpoint_num_layers < 1:
            raise ValueError(
                f"checkpoint_num_layers must be >= 1, got {self.checkpoint_num_layers}"
            )

    @property
    def kv_heads(self) -> int:
        """Key/value heads (equal to the query heads without grouped-query attention)."""
        return self.num_kv_heads or self.num_attention_heads

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings or self.seq_length

    @property
    def tied_embeddings(self) -> bool:
        return not self.no_weight_tying

    def attention_type(self, layer_index: int) -> str:
        """Attention type of transformer layer `layer_index` (0-based)."""
        return self.layer_attention_types[layer_index] if self.layer_attention_types else "global"

    def is_block_layer(self, layer_index: int) -> bool:
        """Whether layer `layer_index` is a block of its own in place of attention and MLP
        (`BLOCK_LAYER_TYPES`; it has no MLP to hold experts)."""
        return self.attention_type(layer_index) in BLOCK_LAYER_TYPES

    @classmethod
    def from_config(cls, cfg):
        """Read `cfg.model`, `cfg.parallel` and `cfg.training` (attribute access only)."""
        m = cfg.model
        if getattr(m, "padded_vocab_size", None) is None:
            raise ValueError(
                "cfg.model.padded_vocab_size is not set: resolve the config with the "
                "tokenizer's vocab_size (config_from_dict(..., vocab_size=V)) before building "
                "the model"
            )
        values = {}
        for name, group in _GROUP_OF.items():
            source = getattr(cfg, group, None)
            if hasattr(source, name):
                values[name] = getattr(source, name)
        values.update(
            vocab_size=m.padded_vocab_size,
            layer_attention_types=tuple(values.get("layer_attention_types") or ()),
            softmax_fusion=bool(
                getattr(m, "scaled_upper_triang_masked_softmax_fusion", False)
                or getattr(m, "scaled_masked_softmax_fusion", False)
            ),
            value_head=_train_impl(cfg) == VALUE_HEAD_TRAIN_IMPL,
        )
        return cls(**values)


ModelArgs = dataclasses.make_dataclass(
    "ModelArgs",
    [
        ("vocab_size", int),
        *_CONFIG_FIELDS,
        ("softmax_fusion", bool, dataclasses.field(default=False)),
        ("value_head", bool, dataclasses.field(default=False)),
    ],
    bases=(_ModelArgsMethods,),
    frozen=True,
    kw_only=True,
    namespace={
        "__module__": __name__,
        "__doc__": _DOC,
    },
)


def choose(registry: dict, key: str, value: str):
    """`registry[value]`, or a `ValueError` naming the config key, the value and valid ones."""
    if value in registry:
        return registry[value]
    close = difflib.get_close_matches(str(value), list(registry), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ValueError(
        f"model {key} '{value}' is not supported; valid values: {', '.join(sorted(registry))}{hint}"
    )
