"""Hugging Face Mixtral (`MixtralForCausalLM`): Mistral's attention with a sparse MoE block in
every layer (issue 13).

Mixtral's block (transformers 5) is our `MoEMLP` (`megatron/model/moe.py`) with:

- the router `mlp.gate.weight` `(E, h)` (no bias) = our `mlp.router.weight`; softmax over all
  experts, the top `num_experts_per_tok`, their probabilities divided by their sum: our
  `moe_router_type: topk` with `moe_router_weights: softmax_renormalized` (or `topk_softmax`,
  the same values); the softmax is taken in fp32 (`moe_lbl_in_fp32: true` on import);
- the experts `mlp.experts.gate_up_proj` `(E, 2 ffn, h)` = our `w_gate` then `w_in` along the
  rows (`act(gate) * up`), `mlp.experts.down_proj` `(E, h, ffn)` = our `w_out`; no biases;
- every layer a MoE layer (`moe_expert_interval: 1`), no token dropping (dropless), training
  jitter `router_jitter_noise` = our `moe_jitter_eps` (0 = none), `router_aux_loss_coef` =
  `moe_aux_loss_coeff` (a training term; Mixtral has no router z-loss, ours is not exported).

Anything else (Sinkhorn or GPT-NeoX's unnormalised weights, token dropping, dense layers
between MoE ones, expert biases, DeepSpeed's MoE type) is refused on export. Registered into
`HF_CONFIGS`/`HF_ARCHITECTURES` when `megatron.model` is imported.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from megatron.model.args import ModelArgs
from megatron.model.hf_config import HF_CONFIGS, Rule, one_of, only
from megatron.model.hf_families import family_specs
from megatron.model.hf_names import HF_ARCHITECTURES, LLAMA, Part

DENSE_MLP = ("mlp.dense_h_to_4h", "mlp.dense_h_to_4h_gate", "mlp.dense_4h_to_h")
# MoE options that change nothing Mixtral computes: capacity keys without token dropping
# (refused), PR-MoE's residual (not read by our `megablocks` type), the layout, a
# training-only loss term and the precision of the router softmax (fp32 in Mixtral).
MOE_FREE = {
    "moe_train_capacity_factor",
    "moe_eval_capacity_factor",
    "moe_min_capacity",
    "moe_use_residual",
    "moe_expert_parallel_size",
    "moe_z_loss_coeff",
    "moe_lbl_in_fp32",
    "moe_glu",  # the experts are gated anyway: the activation must be a GLU (Llama's rule)
}
MIXTRAL_WEIGHTS = ("softmax_renormalized", "topk_softmax")


def mixtral_rules() -> dict[str, Rule]:
    """What a Mixtral MoE block needs of our MoE options (module docstring)."""
    return dict(
        moe_num_experts=Rule(
            lambda args: args.moe_num_experts > 1, "needs > 1: every Mixtral layer has experts"
        ),
        moe_type=only("moe_type", "megablocks", "DeepSpeed's MoE layer is not Mixtral's"),
        moe_router_type=only("moe_router_type", "topk", "Mixtral routes by softmax top-k"),
        moe_router_weights=one_of(
            "moe_router_weights",
            MIXTRAL_WEIGHTS,
            "Mixtral renormalises the top-k probabilities to sum to 1",
        ),
        moe_token_dropping=only(
            "moe_token_dropping", False, "Mixtral computes every routed token (no capacity)"
        ),
        moe_expert_interval=only("moe_expert_interval", 1, "every Mixtral layer is a MoE layer"),
        enable_expert_tensor_parallelism=only(
            "enable_expert_tensor_parallelism", False, "not built"
        ),
        use_bias_in_mlp=only("use_bias_in_mlp", False, "Mixtral's experts have no biases"),
    )


def mixtral_fields(args: ModelArgs) -> dict:
    derived = args.head_dim * args.num_attention_heads == args.hidden_size
    return dict(
        head_dim=None if derived else args.head_dim,  # MixtralConfig writes null when derived
        num_local_experts=args.moe_num_experts,
        num_experts_per_tok=args.moe_top_k,
        router_jitter_noise=float(args.moe_jitter_eps or 0.0),
        router_aux_loss_coef=args.moe_aux_loss_coeff,
    )


def mixtral_spec():
    mistral = family_specs()["mistral"]
    rules = {**mistral.rules, **mixtral_rules()}
    return dataclasses.replace(
        mistral,
        hf_class="MixtralForCausalLM",
        rules=rules,
        free=(mistral.free | MOE_FREE) - set(rules),
        fields=lambda args: {**mistral.fields(args), **mixtral_fields(args)},
        omit=mistral.omit | {"mlp_bias", "attention_bias"},
    )


def mixtral_names():
    layer = {k: v for k, v in LLAMA.layer.items() if not k.startswith(DENSE_MLP)}
    experts = "model.layers.{i}.mlp.experts."
    layer.update(
        {
            "mlp.router.weight": "model.layers.{i}.mlp.gate.weight",
            "mlp.experts.w_gate": Part(experts + "gate_up_proj", 0),
            "mlp.experts.w_in": Part(experts + "gate_up_proj", 1),
            "mlp.experts.w_out": experts + "down_proj",
        }
    )
    return dataclasses.replace(LLAMA, hf_class="MixtralForCausalLM", layer=layer)


EXPERT = re.compile(
    r"^(model\.layers\.\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(w[123])\.weight$"
)


def fuse_stored_experts(hf_state: dict) -> dict:
    """Mixtral's files as `save_pretrained` writes them (per-expert `block_sparse_moe.experts.
    {e}.w1/w2/w3.weight`: gate, down, up) -> the model's stacked tensors `mlp.experts.
    gate_up_proj` / `down_proj`; other names with `block_sparse_moe.` read as `mlp.`."""
    out, experts = {}, {}
    for name, tensor in hf_state.items():
        match = EXPERT.match(name)
        if match:
            layer, e, w = match.groups()
            experts.setdefault(layer, {}).setdefault(w, {})[int(e)] = tensor
        else:
            out[name.replace(".block_sparse_moe.", ".mlp.")] = tensor
    for layer, ws in experts.items():
        stacked = {w: torch.stack([t[e] for e in sorted(t)]) for w, t in ws.items()}
        if set(stacked) != {"w1", "w2", "w3"} or len({len(t) for t in ws.values()}) != 1:
            raise ValueError(f"{layer}: Mixtral experts need w1, w2 and w3 for every expert")
        out[f"{layer}.mlp.experts.gate_up_proj"] = torch.cat((stacked["w1"], stacked["w3"]), 1)
        out[f"{layer}.mlp.experts.down_proj"] = stacked["w2"]
    return out


def register() -> None:
    HF_CONFIGS["mixtral"] = mixtral_spec()
    HF_ARCHITECTURES["mixtral"] = mixtral_names()


register()
