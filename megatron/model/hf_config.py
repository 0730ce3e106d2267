"""The Hugging Face config matching a `ModelArgs`, and what each architecture can express.

Used with the rename table (`hf_names.py`) to export a model, and by the parity tests to
build the Hugging Face twin (transformers 5 argument names). Every `ModelArgs` field is
classified, so that an export can never drop a feature silently:

- `NEUTRAL`: does not change the function the exported weights compute (initialisation,
  dropout, recomputation, parallel layout, kernels numerically equal to their reference);
- `CARRIED`: written into the Hugging Face config for any value (sizes, rotary base, tying);
- per architecture (`HF_CONFIGS`), `rules`: the only values the class can express (anything
  else is refused naming the option, its value and what the class needs), and `free`: options
  it carries for any value or that the required layers never read.

A field in none of these (a model option added later) is refused whenever it differs from
its default, until it is classified here (a unit test asks for that).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from megatron.config.groups.moe import MoEConfig
from megatron.config.groups.mup import MUP_MODEL_KEYS
from megatron.model.args import ModelArgs, choose
from megatron.model.mlp import mlp_inner_size

NEUTRAL = frozenset(
    {
        "init_method",
        "output_layer_init_method",
        "init_method_std",
        "hidden_dropout",
        "attention_dropout",
        "softmax_fusion",
        "rope_fusion",
        # Its effect (GeLU's tanh form) is resolved into `activation`, which is checked.
        "bias_gelu_fusion",
        "attention_softmax_in_fp32",
        # Divides the scores by the layer number and multiplies back: the same function.
        "apply_query_key_layer_scaling",
        "checkpoint_activations",
        "checkpoint_num_layers",
        "partition_activations",
        "contiguous_checkpointing",
        "checkpoint_in_cpu",
        "synchronize_each_layer",
        "profile_backward",
        "sequence_parallel",
        "pipe_parallel_size",
        "pipe_partition_method",
        "seed",
        "z_loss",  # a training objective term: the function of the weights is unchanged
        # How many tokens the head and loss take at a time: the same logits and loss.
        "loss_chunk_tokens",
        # Which logit columns the loss counts (padding masked out): the logits are unchanged,
        # and `vocab_size` in the export trims the padding rows.
        "true_vocab_size",
        # Widths of `rwkv` layers only, which no class can express (ATTENTION_RULE refuses them).
        "dim_att",
        "head_size",
        "ffn_dim",
    }
)
CARRIED = frozenset(
    {
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
        "seq_length",
        "max_position_embeddings",
        "head_dim",  # a rule where the class cannot set it (HEAD_DIM_RULE)
        "intermediate_size",
        "mlp_multiple_of",
        "rotary_emb_base",
        "rope_scaling",  # both classes take every rule in `rope_parameters`
        "no_weight_tying",
        # A reward model: the same body, `...ForSequenceClassification`'s `score` as its head
        # (`megatron/checkpoint_tools/hf_reward.py` turns the config into that class's).
        "value_head",
    }
)
# Options only `mamba` layers read: the attention classes' ATTENTION_RULE admits no Mamba
# layer, and the Mamba class's rules check them (`hf_mamba.py`). Its kernel switches compute
# the reference's function, and fp32 storage of A_log and D is a training-time choice.
MAMBA_LAYER_OPTIONS = frozenset(
    {
        "mamba_selective_scan_fusion",
        "mamba_causal_conv_fusion",
        "mamba_inner_func_fusion",
        "mamba_selective_fp32_params",
        "mamba_use_bias_in_conv",
        "mamba_use_bias_in_linears",
    }
)
# Attention types that are all full causal softmax attention (only the kernel differs).
FULL_CAUSAL_ATTENTION = ("global", "flash", "sdpa")


@dataclass(frozen=True)
class Rule:
    """The values of one option an architecture can express."""

    valid: Callable[[ModelArgs], bool]
    needs: str
    """What the architecture needs instead, as said to the user."""


def only(option: str, value, why: str) -> Rule:
    return Rule(lambda args: getattr(args, option) == value, f"needs {value!r}: {why}")


def one_of(option: str, values, why: str) -> Rule:
    return Rule(lambda args: getattr(args, option) in values, f"needs one of {list(values)}: {why}")


ATTENTION_RULE = Rule(
    lambda args: all(t in FULL_CAUSAL_ATTENTION for t in args.layer_attention_types),
    f"needs attention types among {list(FULL_CAUSAL_ATTENTION)} (full causal attention)",
)
NO_QK_NORM = "the class has no query/key normalisation"
NO_WINDOW = only("sliding_window_width", None, "the class has no sliding-window attention")
HEAD_DIM_RULE = Rule(
    lambda args: args.head_dim * args.num_attention_heads == args.hidden_size,
    "needs hidden_size / num_attention_heads: the class has no head_dim setting",
)
QKV_BIAS_RULE = Rule(
    lambda args: args.use_bias_in_attn_linear or not args.use_bias_in_qkv,
    "needs False without use_bias_in_attn_linear: the class biases all four attention "
    "projections (attention_bias) or none",
)
NO_MOE = only("moe_num_experts", 1, "the class has dense MLPs only (no mixture of experts)")
# The other MoE keys change nothing while moe_num_experts is 1, which NO_MOE requires.
MOE_DEPENDENT = frozenset(f.name for f in dataclasses.fields(MoEConfig)) - {"moe_num_experts"}
NO_MUP = only("use_mup", False, "the class computes the standard parametrisation (no muP scales)")
# The other muP keys change nothing while use_mup is false, which NO_MUP requires.
MUP_DEPENDENT = frozenset(MUP_MODEL_KEYS) - {"use_mup"}
# Read only by `pos_emb: rpe` and gmlp/amlp layers, which every class's rules refuse
# (pos_emb rotary, ATTENTION_RULE): they change nothing in a model that can be exported.
RPE_GMLP_DEPENDENT = frozenset({"rpe_num_buckets", "rpe_max_distance", "gmlp_attn_dim"})


@dataclass(frozen=True)
class HFConfigSpec:
    hf_class: str
    rules: dict[str, Rule]
    free: frozenset[str]
    """Options this architecture carries for any value, or never reads."""
    fields: Callable[[ModelArgs], dict]
    """Config arguments specific to the architecture."""
    omit: frozenset[str] = frozenset()
    """Shared config arguments the class does not have (not written)."""


# Our activation -> Hugging Face `hidden_act` (exactly the same function in `ACT2FN`).
NEOX_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_tanh": "gelu_pytorch_tanh",
    "silu": "silu",
    "relu": "relu",
    "relu_squared": "relu2",
}
# Llama's MLP is `down(act(gate(x)) * up(x))`: our gated activations with `act`.
LLAMA_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}

HF_CONFIGS: dict[str, HFConfigSpec] = {
    "gpt_neox": HFConfigSpec(
        hf_class="GPTNeoXForCausalLM",
        rules=dict(
            norm=only("norm", "layernorm", "the class uses LayerNorm"),
            use_bias_in_norms=only("use_bias_in_norms", True, "its LayerNorms have a bias"),
            activation=one_of(
                "activation", NEOX_ACTIVATIONS, "its MLP is not gated; hidden_act must match"
            ),
            pos_emb=only("pos_emb", "rotary", "the class encodes positions with rotary only"),
            num_kv_heads=Rule(
                lambda args: args.kv_heads == args.num_attention_heads,
                "needs one key/value head per query head: the class has no grouped-query attention",
            ),
            gpt_j_tied=Rule(
                lambda args: not (args.gpt_j_residual and args.gpt_j_tied),
                "needs False with gpt_j_residual: the class has separate attention and MLP norms",
            ),
            use_bias_in_mlp=only("use_bias_in_mlp", True, "its MLP layers always have biases"),
            use_qk_layernorm=only("use_qk_layernorm", False, NO_QK_NORM),
            layer_attention_types=ATTENTION_RULE,
            head_dim=HEAD_DIM_RULE,
            sliding_window_width=NO_WINDOW,
            use_bias_in_qkv=QKV_BIAS_RULE,
            moe_num_experts=NO_MOE,
            use_mup=NO_MUP,
        ),
        free=frozenset(
            {
                "rotary_pct",
                "gpt_j_residual",
                "use_bias_in_attn_linear",
                "layernorm_epsilon",
                "rms_norm_epsilon",
                "scalenorm_epsilon",
            }
        ),
        fields=lambda args: dict(
            hidden_act=NEOX_ACTIVATIONS[args.activation],
            layer_norm_eps=args.layernorm_epsilon,
            use_parallel_residual=args.gpt_j_residual,
            hidden_dropout=args.hidden_dropout,
        ),
    ),
    "llama": HFConfigSpec(
        hf_class="LlamaForCausalLM",
        rules=dict(
            norm=only("norm", "rmsnorm", "the class uses RMSNorm"),
            use_bias_in_norms=only("use_bias_in_norms", False, "its RMSNorms have no bias"),
            activation=one_of("activation", LLAMA_ACTIVATIONS, "its MLP is gated"),
            pos_emb=only("pos_emb", "rotary", "the class encodes positions with rotary only"),
            rotary_pct=only("rotary_pct", 1.0, "the class rotates whole heads"),
            gpt_j_residual=only("gpt_j_residual", False, "the class has a sequential residual"),
            use_qk_layernorm=only("use_qk_layernorm", False, NO_QK_NORM),
            layer_attention_types=ATTENTION_RULE,
            sliding_window_width=NO_WINDOW,
            use_bias_in_qkv=QKV_BIAS_RULE,
            moe_num_experts=NO_MOE,
            use_mup=NO_MUP,
        ),
        free=frozenset(
            {
                "num_kv_heads",
                "use_bias_in_attn_linear",
                "use_bias_in_mlp",
                "rms_norm_epsilon",
                "layernorm_epsilon",
                "scalenorm_epsilon",
                "gpt_j_tied",  # no effect without gpt_j_residual, which is refused
            }
        ),
        fields=lambda args: dict(
            hidden_act=LLAMA_ACTIVATIONS[args.activation],
            num_key_value_heads=args.kv_heads,
            head_dim=args.head_dim,
            rms_norm_eps=args.rms_norm_epsilon,
            mlp_bias=args.use_bias_in_mlp,
        ),
    ),
}


def unclassified(spec: HFConfigSpec, args_type: type = ModelArgs) -> list[str]:
    """`ModelArgs` fields the spec says nothing about (each must be classified)."""
    known = NEUTRAL | CARRIED | MOE_DEPENDENT | MAMBA_LAYER_OPTIONS | RPE_GMLP_DEPENDENT
    known |= MUP_DEPENDENT
    known |= spec.free | set(spec.rules)
    return [f.name for f in dataclasses.fields(args_type) if f.name not in known]


def inexpressible(args: ModelArgs, arch: str) -> list[str]:
    """What `args` has that the architecture cannot express, one line per option."""
    spec = choose(HF_CONFIGS, "Hugging Face architecture", arch)
    problems = [
        f"{option}={getattr(args, option)!r} ({rule.needs})"
        for option, rule in spec.rules.items()
        if not rule.valid(args)
    ]
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    for option in unclassified(spec, type(args)):
        if getattr(args, option) != defaults[option]:
            problems.append(
                f"{option}={getattr(args, option)!r} (the exporter does not know this option; "
                f"only its default {defaults[option]!r} can be exported)"
            )
    return problems


def hf_config(args: ModelArgs, arch: str, vocab_size: int | None = None) -> dict:
    """Keyword arguments of `GPTNeoXConfig` / `LlamaConfig` for this model.

    `vocab_size` (default: the padded vocabulary) sets the Hugging Face vocabulary. Raises
    `ValueError` naming every option (and its value) the architecture cannot express.
    """
    problems = inexpressible(args, arch)
    if problems:
        raise ValueError(
            f"this model cannot be exported as Hugging Face {HF_CONFIGS[arch].hf_class}: "
            + "; ".join(problems)
        )
    spec = HF_CONFIGS[arch]
    config = dict(
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
            **(args.rope_scaling or {}),  # the same field names as transformers'
            "rope_theta": float(args.rotary_emb_base),
            "partial_rotary_factor": args.rotary_pct,
        },
    )
    config.update(spec.fields(args))  # may refine a shared argument
    return {k: v for k, v in config.items() if k not in spec.omit}
