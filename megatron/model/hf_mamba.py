"""Hugging Face Mamba (`MambaForCausalLM`): a model whose every layer is a `mamba` layer.

`MambaForCausalLM` (transformers 5) is our Mamba-only model with RMSNorm (no bias), no
positional encoding and `d_state` 16, a convolution 4 wide and `time_step_rank` ceil(h / 16)
(GPT-NeoX's fixed sizes, `megatron/model/mamba.py`); its `expand` is our `d_inner / hidden`
(an integer), `use_conv_bias` our `mamba_use_bias_in_conv`. Its `use_bias` biases `in_proj`
and `out_proj` only while ours also biases `x_proj`, so `mamba_use_bias_in_linears` must be
false. Names: `backbone.embeddings`, `backbone.layers.{i}.norm` and `.mixer.*` (the same
names inside the mixer as ours), `backbone.norm_f`, `lm_head` (tied by default).

Registered into `HF_CONFIGS`/`HF_ARCHITECTURES` when `megatron.model` is imported;
`megatron/checkpoint_tools/hf_import.py::model_keys_from_hf` reads the class back.
"""

from __future__ import annotations

from megatron.model.args import ModelArgs
from megatron.model.hf_config import HF_CONFIGS, NO_MUP, HFConfigSpec, Rule, only
from megatron.model.hf_names import HF_ARCHITECTURES, HFArchitecture
from megatron.model.mamba import D_CONV, D_STATE, mamba_dt_rank, mamba_inner_size

MAMBA_TYPE = "mamba"
MIXER = ("in_proj", "conv1d", "x_proj", "dt_proj", "out_proj")
# Options that only attention layers and MLPs read: a Mamba-only model has neither.
ATTENTION_AND_MLP = frozenset(
    {
        "num_kv_heads",
        "head_dim",
        "sliding_window_width",
        "rotary_pct",
        "gpt_j_residual",
        "gpt_j_tied",
        "activation",  # the mixer's activation is always SiLU
        "use_bias_in_attn_linear",
        "use_bias_in_qkv",
        "use_bias_in_mlp",
        "use_qk_layernorm",
        "layernorm_epsilon",
        "scalenorm_epsilon",
    }
)


def mamba_rules() -> dict[str, Rule]:
    return dict(
        layer_attention_types=Rule(
            lambda args: (
                bool(args.layer_attention_types) and set(args.layer_attention_types) == {MAMBA_TYPE}
            ),
            "needs every layer to be 'mamba': the class has no attention layers",
        ),
        norm=only("norm", "rmsnorm", "the class uses RMSNorm"),
        use_bias_in_norms=only("use_bias_in_norms", False, "its RMSNorms have no bias"),
        pos_emb=only("pos_emb", "none", "the class has no positional encoding"),
        intermediate_size=Rule(
            lambda args: mamba_inner_size(args) % args.hidden_size == 0,
            "needs a multiple of hidden_size: the class sets d_inner as an integer `expand`",
        ),
        mamba_use_bias_in_linears=only(
            "mamba_use_bias_in_linears", False, "the class never biases x_proj"
        ),
        moe_num_experts=only("moe_num_experts", 1, "the class has no experts"),
        use_mup=NO_MUP,
        value_head=only("value_head", False, "reward models are exported as Llama-like only"),
    )


def mamba_fields(args: ModelArgs) -> dict:
    return dict(
        expand=mamba_inner_size(args) // args.hidden_size,
        state_size=D_STATE,
        conv_kernel=D_CONV,
        time_step_rank=mamba_dt_rank(args),
        use_bias=False,
        use_conv_bias=args.mamba_use_bias_in_conv,
        hidden_act="silu",
        layer_norm_epsilon=args.rms_norm_epsilon,
    )


def mamba_spec() -> HFConfigSpec:
    return HFConfigSpec(
        hf_class="MambaForCausalLM",
        rules=mamba_rules(),
        free=ATTENTION_AND_MLP | {"rms_norm_epsilon"},
        fields=mamba_fields,
        omit=frozenset(
            {
                "num_attention_heads",
                "intermediate_size",
                "max_position_embeddings",
                "attention_dropout",
                "attention_bias",
                "rope_parameters",
            }
        ),
    )


def mamba_names() -> HFArchitecture:
    layer = {"norm.weight": "backbone.layers.{i}.norm.weight"}
    for name in MIXER:
        for kind in ("weight", "bias"):
            layer[f"mixer.{name}.{kind}"] = f"backbone.layers.{{i}}.mixer.{name}.{kind}"
    for name in ("A_log", "D"):
        layer[f"mixer.{name}"] = f"backbone.layers.{{i}}.mixer.{name}"
    return HFArchitecture(
        hf_class="MambaForCausalLM",
        embedding="backbone.embeddings.weight",
        head="lm_head.weight",
        final_norm={"norm.weight": "backbone.norm_f.weight"},
        layer=layer,
    )


def is_mamba_model(args: ModelArgs) -> bool:
    """Every layer a `mamba` layer (what `MambaForCausalLM` can hold)."""
    return mamba_rules()["layer_attention_types"].valid(args)


def register() -> None:
    HF_CONFIGS[MAMBA_TYPE] = mamba_spec()
    HF_ARCHITECTURES[MAMBA_TYPE] = mamba_names()


register()
