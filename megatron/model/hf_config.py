"""The Hugging Face config matching a `ModelArgs` (transformers 5 argument names).

Used with the rename table (`hf_names.py`) to export a model, and by the parity tests to
build the Hugging Face twin. Each architecture is an entry of `HF_CONFIGS`: the settings it
fixes (a model with another value cannot be expressed and is refused with a `ValueError`) and
the config arguments specific to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from megatron.model.args import ModelArgs, choose
from megatron.model.mlp import mlp_inner_size


@dataclass(frozen=True)
class HFConfigSpec:
    requirements: dict[str, object]
    """`ModelArgs` field (or derived feature, see `_feature`) -> the only value expressible."""
    fields: Callable[[ModelArgs], dict]
    """Config arguments specific to the architecture."""


def _feature(args: ModelArgs, key: str):
    derived = {
        "num_kv_heads_equal_heads": args.kv_heads == args.num_attention_heads,
        "mlp_bias_equals_attn_bias": args.use_bias_in_mlp == args.use_bias_in_attn_linear,
    }
    return derived[key] if key in derived else getattr(args, key)


HF_CONFIGS: dict[str, HFConfigSpec] = {
    "gpt_neox": HFConfigSpec(
        requirements=dict(
            norm="layernorm",
            activation="gelu",
            pos_emb="rotary",
            use_bias_in_norms=True,
            gpt_j_tied=False,
            num_kv_heads_equal_heads=True,
            mlp_bias_equals_attn_bias=True,
        ),
        fields=lambda args: dict(
            hidden_act="gelu",
            layer_norm_eps=args.layernorm_epsilon,
            use_parallel_residual=args.gpt_j_residual,
            hidden_dropout=args.hidden_dropout,
        ),
    ),
    "llama": HFConfigSpec(
        requirements=dict(
            norm="rmsnorm",
            activation="swiglu",
            pos_emb="rotary",
            use_bias_in_norms=False,
            gpt_j_residual=False,
            rotary_pct=1.0,
        ),
        fields=lambda args: dict(
            hidden_act="silu",
            num_key_value_heads=args.kv_heads,
            head_dim=args.head_dim,
            rms_norm_eps=args.rms_norm_epsilon,
            mlp_bias=args.use_bias_in_mlp,
        ),
    ),
}


def hf_config(args: ModelArgs, arch: str, vocab_size: int | None = None) -> dict:
    """Keyword arguments of `GPTNeoXConfig` / `LlamaConfig` for this model.

    `vocab_size` (default: the padded vocabulary) sets the Hugging Face vocabulary. Raises
    `ValueError` naming the settings the architecture cannot express.
    """
    spec = choose(HF_CONFIGS, "Hugging Face architecture", arch)
    wrong = {k: _feature(args, k) for k, v in spec.requirements.items() if _feature(args, k) != v}
    if wrong:
        raise ValueError(
            f"this model cannot be expressed as Hugging Face {arch}: it has {wrong}, the "
            f"architecture needs {spec.requirements}"
        )
    return dict(
        vocab_size=vocab_size or args.vocab_size,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_attention_heads,
        intermediate_size=mlp_inner_size(args),
        max_position_embeddings=args.max_positions,
        tie_word_embeddings=args.tied_embeddings,
        attention_dropout=args.attention_dropout,
        attention_bias=args.use_bias_in_attn_linear,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(args.rotary_emb_base),
            "partial_rotary_factor": args.rotary_pct,
        },
        **spec.fields(args),
    )
