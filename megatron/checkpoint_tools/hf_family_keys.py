"""Our config keys for what Mistral, Qwen2, Qwen3 and Mixtral add to Llama (the inverse of
`megatron/model/hf_families.py` and `hf_mixtral.py`): attention biases, QK-norm, the sliding
window and Mixtral's MoE block.

`hf_import.model_keys_from_hf` reads these families as Llama (RMSNorm, SwiGLU, GQA, rotary,
`head_dim`) and then updates its keys with `family_keys`. Qwen's window is per layer; a config
whose layers do not all agree (e.g. `max_window_layers` inside the model) is refused: our
`sliding_window_width` applies to every layer.
"""

from __future__ import annotations

# Hugging Face window settings `hf_import` does not compare one by one on the way back: they
# are compared through the window each layer ends up with (`_window`).
WINDOW_KEYS = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")


def _width(sliding_window) -> int | None:
    """Our `sliding_window_width` for Hugging Face's `sliding_window` (the token included)."""
    if sliding_window is None:
        return None
    if int(sliding_window) < 1:
        raise ValueError(f"sliding_window {sliding_window} must be a positive integer or null")
    return int(sliding_window) - 1


def qwen_layer_types(hf: dict) -> list[str]:
    """Each layer's attention kind, as `Qwen2Config`/`Qwen3Config` derive it."""
    layers = hf["num_hidden_layers"]
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
    first = hf.get("max_window_layers", 28)
    return [
        "sliding_attention" if window is not None and i >= first else "full_attention"
        for i in range(layers)
    ]


def _qwen_window(hf: dict) -> int | None:
    kinds = qwen_layer_types(hf)
    unknown = sorted(set(kinds) - {"sliding_attention", "full_attention"})
    if unknown:
        raise ValueError(f"layer_types {unknown} are not supported (full or sliding attention)")
    if "sliding_attention" not in kinds:
        return None
    if "full_attention" in kinds:
        sliding = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]
        raise ValueError(
            f"the Hugging Face config slides the attention window on layers {sliding} only "
            f"(max_window_layers {hf.get('max_window_layers')}): a window on some layers is "
            "not supported; sliding_window_width applies to every layer"
        )
    return _width(hf.get("sliding_window"))


def family_keys(arch: str, hf: dict) -> dict:
    """Config keys of `arch` beyond Llama's (empty for `llama` itself)."""
    if arch == "mistral":
        return dict(
            use_bias_in_attn_linear=False,
            use_bias_in_qkv=False,
            sliding_window_width=_width(hf.get("sliding_window")),
        )
    if arch == "qwen2":
        return dict(
            use_bias_in_attn_linear=False,
            use_bias_in_qkv=True,
            sliding_window_width=_qwen_window(hf),
        )
    if arch == "mixtral":
        jitter = hf.get("router_jitter_noise") or 0.0
        return dict(
            use_bias_in_attn_linear=False,
            use_bias_in_qkv=False,
            sliding_window_width=_width(hf.get("sliding_window")),
            moe_num_experts=hf.get("num_local_experts", 8),
            moe_top_k=hf.get("num_experts_per_tok", 2),
            moe_router_type="topk",
            moe_router_weights="softmax_renormalized",
            moe_lbl_in_fp32=True,  # Mixtral's router softmax is fp32
            moe_token_dropping=False,
            moe_expert_interval=1,
            moe_jitter_eps=float(jitter) if jitter else None,
            moe_aux_loss_coeff=hf.get("router_aux_loss_coef", 0.001),
        )
    if arch == "qwen3":
        return dict(use_qk_layernorm=True, sliding_window_width=_qwen_window(hf))
    return {}
