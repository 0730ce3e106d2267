"""`ModelArgs`: every setting the model reads, as explicit fields, and its config adapter.

The model code takes a `ModelArgs`, never the whole config, so it can be built in tests and
tools without the config system. `ModelArgs.from_config(cfg)` reads the resolved config's
`model`, `parallel` and `training` groups (duck-typed: a `types.SimpleNamespace` with those
attributes works too). Field meanings are the config keys' (see `megatron/config/model.py`).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelArgs:
    """Architecture and model-side parallel settings of one GPT model."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    """Rows of the embedding and output head: the padded vocabulary, divisible by tp."""
    seq_length: int
    max_position_embeddings: int | None = None
    num_kv_heads: int | None = None
    norm: str = "layernorm"
    layernorm_epsilon: float = 1.0e-5
    rms_norm_epsilon: float = 1.0e-8
    scalenorm_epsilon: float = 1.0e-8
    pos_emb: str = "learned"
    rotary_pct: float = 1.0
    rotary_emb_base: int = 10000
    no_weight_tying: bool = False
    gpt_j_residual: bool = False
    gpt_j_tied: bool = False
    activation: str = "gelu"
    intermediate_size: int | None = None
    mlp_multiple_of: int = 1
    init_method: str = "normal"
    output_layer_init_method: str = "scaled_normal"
    init_method_std: float = 0.02
    use_bias_in_norms: bool = True
    use_bias_in_attn_linear: bool = True
    use_bias_in_mlp: bool = True
    use_qk_layernorm: bool = False
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    layer_attention_types: tuple[str, ...] = ()
    """One of `global`/`flash`/`sdpa` per layer; empty means all `global`."""
    softmax_fusion: bool = False
    """`global` layers use the fused scale-mask-softmax path (kernel when available)."""
    rope_fusion: bool = False
    attention_softmax_in_fp32: bool = False
    apply_query_key_layer_scaling: bool = False
    checkpoint_activations: bool = False
    checkpoint_num_layers: int = 1
    partition_activations: bool = False
    contiguous_checkpointing: bool = False
    checkpoint_in_cpu: bool = False
    synchronize_each_layer: bool = False
    profile_backward: bool = False
    sequence_parallel: bool = False
    pipe_parallel_size: int = 0
    pipe_partition_method: str = "type:transformer|mlp"
    seed: int = 1234
    """Base seed of the weights: layer `i` of the spec list is built from `seed + i`, so the
    same seed gives the same full model at any tensor/pipeline layout."""

    def __post_init__(self):
        for key in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model {key} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not divisible by "
                f"num_kv_heads {self.kv_heads}; num_kv_heads must divide it"
            )
        if self.checkpoint_num_layers < 1:
            raise ValueError(
                f"checkpoint_num_layers must be >= 1, got {self.checkpoint_num_layers}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

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

    @classmethod
    def from_config(cls, cfg) -> ModelArgs:
        """Read `cfg.model`, `cfg.parallel` and `cfg.training` (attribute access only)."""
        m, par = cfg.model, cfg.parallel
        if m.padded_vocab_size is None:
            raise ValueError(
                "cfg.model.padded_vocab_size is not set: resolve the config with the "
                "tokenizer's vocab_size (config_from_dict(..., vocab_size=V)) before building "
                "the model"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: getattr(m, k) for k in names if hasattr(m, k)}
        values.update(
            vocab_size=m.padded_vocab_size,
            layer_attention_types=tuple(getattr(m, "layer_attention_types", ()) or ()),
            softmax_fusion=bool(
                getattr(m, "scaled_upper_triang_masked_softmax_fusion", False)
                or getattr(m, "scaled_masked_softmax_fusion", False)
            ),
            sequence_parallel=bool(getattr(par, "sequence_parallel", False)),
            pipe_parallel_size=par.pipe_parallel_size,
            pipe_partition_method=getattr(par, "pipe_partition_method", cls.pipe_partition_method),
            seed=getattr(getattr(cfg, "training", None), "seed", cls.seed),
        )
        return cls(**values)


def choose(registry: dict, key: str, value: str):
    """`registry[value]`, or a `ValueError` naming the config key, the value and valid ones."""
    if value in registry:
        return registry[value]
    close = difflib.get_close_matches(str(value), list(registry), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ValueError(
        f"model {key} '{value}' is not supported; valid values: {', '.join(sorted(registry))}{hint}"
    )
