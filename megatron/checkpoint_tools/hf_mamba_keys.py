"""Our config keys for a Hugging Face `MambaForCausalLM` (the inverse of
`megatron/model/hf_mamba.py`): every layer a `mamba` layer, RMSNorm without bias, no
positional encoding.

`hf_import` asks `hf_config` back for the class's settings and compares them with the file,
so a state size, convolution width, step rank or activation other than GPT-NeoX's fixed ones,
or `use_bias: true` (which leaves `x_proj` unbiased, unlike our `mamba_use_bias_in_linears`),
is refused as a setting that would not survive conversion.
"""

from __future__ import annotations

# Mamba layers have no attention heads, but the key is required and must divide hidden_size.
HEADS = 1


def mamba_keys(hf: dict) -> dict:
    """Config keys of the Mamba model the Hugging Face config `hf` describes."""
    layers, hidden = hf["num_hidden_layers"], hf["hidden_size"]
    return dict(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=HEADS,
        intermediate_size=hf.get("intermediate_size") or int(hf.get("expand", 2) * hidden),
        attention_config=[[["mamba"], layers]],
        norm="rmsnorm",
        rms_norm_epsilon=hf.get("layer_norm_epsilon", 1.0e-5),
        use_bias_in_norms=False,
        pos_emb="none",
        no_weight_tying=not hf.get("tie_word_embeddings", True),
        mamba_use_bias_in_conv=hf.get("use_conv_bias", True),
        mamba_use_bias_in_linears=hf.get("use_bias", False),
    )
