"""Hugging Face Mistral, Qwen2 and Qwen3: Llama's layout with attention variants (issue 13).

Each family is the `llama` entry of `HF_CONFIGS` (its rules, free options and fields, so a rule
added there, e.g. for mixture of experts, applies here too) with what the class differs in:

| class                | attention biases | head_dim       | QK-norm | sliding window       |
| -------------------- | ---------------- | -------------- | ------- | -------------------- |
| `MistralForCausalLM` | none             | any            | no      | `sliding_window`     |
| `Qwen2ForCausalLM`   | q/k/v only       | hidden / heads | no      | `use_sliding_window` |
| `Qwen3ForCausalLM`   | all four or none | any            | RMSNorm | `use_sliding_window` |

None of them has MLP biases. Hugging Face's `sliding_window` counts the token itself, so it is
our `sliding_window_width + 1` (see `megatron/model/attention_backends.py`). Qwen's window
applies per layer (layers from `max_window_layers` on, or `layer_types`); we export it on every
layer (`max_window_layers: 0`), and import only configs whose layers all agree.

Registered into `HF_CONFIGS` when `megatron.model` is imported (this module is imported by the
package, so any import of `megatron.model.hf_config` sees them).
"""

from __future__ import annotations

import dataclasses

from megatron.model.args import ModelArgs
from megatron.model.hf_config import HEAD_DIM_RULE, HF_CONFIGS, QKV_BIAS_RULE, HFConfigSpec, only
from megatron.model.hf_names import HF_ARCHITECTURES, LLAMA

FAMILIES = ("mistral", "qwen2", "qwen3")
NO_MLP_BIAS = only("use_bias_in_mlp", False, "its MLP layers have no biases")


def hf_sliding_window(args: ModelArgs) -> int | None:
    """Hugging Face's `sliding_window` (the token itself included) for our width."""
    width = args.sliding_window_width
    return None if width is None else width + 1


def qwen_window_fields(args: ModelArgs) -> dict:
    """Qwen's window settings: the same on every layer."""
    window = hf_sliding_window(args)
    kind = "full_attention" if window is None else "sliding_attention"
    return dict(
        use_sliding_window=window is not None,
        sliding_window=window,
        max_window_layers=args.num_layers if window is None else 0,
        layer_types=[kind] * args.num_layers,
    )


def _derived(hf_class: str, rules: dict, free: set, fields, omit=()) -> HFConfigSpec:
    llama = HF_CONFIGS["llama"]
    return HFConfigSpec(
        hf_class=hf_class,
        rules={**{k: v for k, v in llama.rules.items() if k not in free}, **rules},
        free=(llama.free | free) - set(rules),
        fields=lambda args: {**llama.fields(args), **fields(args)},
        omit=frozenset({"mlp_bias", *omit}),
    )


def family_specs() -> dict[str, HFConfigSpec]:
    """The three families' `HFConfigSpec`s (see the module docstring)."""
    no_bias = "the class has no attention biases"
    return {
        "mistral": _derived(
            "MistralForCausalLM",
            dict(
                use_bias_in_attn_linear=only("use_bias_in_attn_linear", False, no_bias),
                use_bias_in_qkv=only("use_bias_in_qkv", False, no_bias),
                use_bias_in_mlp=NO_MLP_BIAS,
            ),
            {"sliding_window_width"},
            lambda args: dict(sliding_window=hf_sliding_window(args)),
            omit=("attention_bias",),
        ),
        "qwen2": _derived(
            "Qwen2ForCausalLM",
            dict(
                use_bias_in_attn_linear=only(
                    "use_bias_in_attn_linear", False, "its output projection has no bias"
                ),
                use_bias_in_qkv=only("use_bias_in_qkv", True, "its q/k/v projections have biases"),
                use_bias_in_mlp=NO_MLP_BIAS,
                head_dim=HEAD_DIM_RULE,
            ),
            {"sliding_window_width"},
            qwen_window_fields,
            omit=("attention_bias", "head_dim"),
        ),
        "qwen3": _derived(
            "Qwen3ForCausalLM",
            dict(
                use_qk_layernorm=only(
                    "use_qk_layernorm", True, "the class normalises every query and key head"
                ),
                use_bias_in_qkv=QKV_BIAS_RULE,
                use_bias_in_mlp=NO_MLP_BIAS,
            ),
            {"sliding_window_width"},
            qwen_window_fields,
        ),
    }


def family_names() -> dict:
    """The rename tables: Llama's names under each class; Qwen3 adds the per-head norms."""
    qk_norm = {
        f"attention.qk_norm.{ours}.weight": f"model.layers.{{i}}.self_attn.{theirs}_norm.weight"
        for ours, theirs in (("query", "q"), ("key", "k"))
    }
    return {
        "mistral": dataclasses.replace(LLAMA, hf_class="MistralForCausalLM"),
        "qwen2": dataclasses.replace(LLAMA, hf_class="Qwen2ForCausalLM"),
        "qwen3": dataclasses.replace(
            LLAMA, hf_class="Qwen3ForCausalLM", layer={**LLAMA.layer, **qk_norm}
        ),
    }


def register() -> None:
    HF_CONFIGS.update(family_specs())
    HF_ARCHITECTURES.update(family_names())


register()


def family_of(args: ModelArgs) -> str:
    """The Llama-like class that expresses `args` most directly (for `--architecture auto`)."""
    if args.moe_num_experts > 1:
        return "mixtral"
    if args.use_qk_layernorm:
        return "qwen3"
    if args.use_bias_in_qkv and not args.use_bias_in_attn_linear:
        return "qwen2"
    if args.sliding_window_width is not None:
        return "mistral"
    return "llama"
