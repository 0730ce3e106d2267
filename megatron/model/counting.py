"""Parameter counts: analytic from the config, and real across the ranks of a built model.

`count_parameters(cfg)` is what start-up reports; `count_model_parameters(model, topology)`
counts what was actually built, so tests can hold the two equal. For the Pythia-160M shape
(12 layers, hidden 768, 12 heads, vocab padded to 50304, untied, biases, layernorm, gelu,
rotary) both give 162,322,944.
"""

from __future__ import annotations

import torch

from megatron.model.activations import build_activation
from megatron.model.args import ModelArgs, choose
from megatron.model.gmlp import GMLP_FF_MULT, gmlp_parameters, is_gmlp_layer
from megatron.model.mamba import D_CONV, D_STATE, mamba_dt_rank, mamba_inner_size
from megatron.model.mlp import mlp_inner_size
from megatron.model.moe import is_moe_layer
from megatron.model.norms import NORMS
from megatron.model.rwkv import rwkv_layer_parameters
from megatron.parallel import is_tensor_parallel
from megatron.parallel.host_values import reduce_host


def _norm_parameters(args: ModelArgs, dim: int) -> int:
    cls, _ = choose(NORMS, "norm", args.norm)
    per_norm = {
        "LayerNorm": dim * (2 if args.use_bias_in_norms else 1),
        "RMSNorm": dim * (2 if args.use_bias_in_norms else 1),
        "ScaleNorm": 1,
        "NonParametricLayerNorm": 0,
    }
    return per_norm[cls.__name__]


def layer_parameters(args: ModelArgs, layer_index: int = 1) -> int:
    """Parameters of transformer layer `layer_index` (0-based; MoE layers hold all experts;
    the default 1 is a dense layer unless every layer has experts)."""
    if args.attention_type(layer_index) == "mamba":
        return _mamba_parameters(args)
    if args.attention_type(layer_index) == "rwkv":
        return rwkv_layer_parameters(args)
    h, d = args.hidden_size, args.head_dim
    if is_gmlp_layer(args, layer_index):
        norms = _norm_parameters(args, h) + _norm_parameters(args, GMLP_FF_MULT * h)
        return gmlp_parameters(args, layer_index) + norms
    nq, nkv = args.num_attention_heads, args.kv_heads
    qkv_rows = (nq + 2 * nkv) * d
    qkv_bias = args.use_bias_in_attn_linear or args.use_bias_in_qkv
    attention = h * qkv_rows + nq * d * h + (qkv_rows if qkv_bias else 0)
    attention += h if args.use_bias_in_attn_linear else 0
    if args.use_qk_layernorm:
        attention += 2 * _norm_parameters(args, d)
    if args.pos_emb == "rpe":  # each attention layer's (buckets, heads) table
        attention += args.rpe_num_buckets * nq
    norms = _norm_parameters(args, h) * (1 if args.gpt_j_residual and args.gpt_j_tied else 2)
    return attention + norms + _mlp_parameters(args, layer_index)


def _mamba_parameters(args: ModelArgs) -> int:
    """A `mamba` layer: its norm and mixer (`megatron/model/mamba.py`)."""
    h, di, r = args.hidden_size, mamba_inner_size(args), mamba_dt_rank(args)
    bias = args.mamba_use_bias_in_linears
    in_proj = h * 2 * di + (2 * di if bias else 0)
    conv = di * D_CONV + (di if args.mamba_use_bias_in_conv else 0)
    x_proj = di * (r + 2 * D_STATE) + ((r + 2 * D_STATE) if bias else 0)
    dt_proj = r * di + di
    out_proj = di * h + (h if bias else 0)
    a_log_and_d = di * D_STATE + di
    mixer = in_proj + conv + x_proj + dt_proj + out_proj + a_log_and_d
    return _norm_parameters(args, h) + mixer


def _mlp_parameters(args: ModelArgs, layer_index: int, active: bool = False) -> int:
    """A dense MLP, or a MoE layer's `E` experts (`k` with `active`) plus its router."""
    h, ffn = args.hidden_size, mlp_inner_size(args)
    gated = build_activation(args.activation).gated
    moe = is_moe_layer(args, layer_index)
    inputs = 2 if gated or (moe and args.moe_glu) else 1
    mlp = (inputs + 1) * h * ffn + ((inputs * ffn + h) if args.use_bias_in_mlp else 0)
    if not moe:
        return mlp
    return (args.moe_top_k if active else args.moe_num_experts) * mlp + args.moe_num_experts * h


def parameter_breakdown(args: ModelArgs) -> dict[str, int]:
    """Parameters per part: embedding, position, layers (all of them), final_norm, head."""
    h = args.hidden_size
    return {
        "embedding": args.vocab_size * h,
        "position": args.max_positions * h if args.pos_emb == "learned" else 0,
        "layers": sum(layer_parameters(args, i) for i in range(args.num_layers)),
        "final_norm": _norm_parameters(args, h),
        "head": _head_parameters(args),
    }


def _head_parameters(args: ModelArgs) -> int:
    """A reward model's `(1, h)` value head, else the untied `(V, h)` head (tied: none)."""
    if args.value_head:
        return args.hidden_size
    return 0 if args.tied_embeddings else args.vocab_size * args.hidden_size


def active_parameters(cfg) -> int:
    """Parameters one token runs through: as `count_parameters`, with a MoE layer's `k`
    experts instead of all `E` (the router included)."""
    args = cfg if isinstance(cfg, ModelArgs) else ModelArgs.from_config(cfg)
    moe = sum(
        _mlp_parameters(args, i) - _mlp_parameters(args, i, active=True)
        for i in range(args.num_layers)
    )
    return count_parameters(args) - moe


def count_parameters(cfg) -> int:
    """Total parameters from a resolved config (or a `ModelArgs`), tied weights counted once."""
    args = cfg if isinstance(cfg, ModelArgs) else ModelArgs.from_config(cfg)
    return sum(parameter_breakdown(args).values())


def owned_parameters(model: torch.nn.Module, topology=None) -> list[torch.nn.Parameter]:
    """The parameters whose elements this rank counts in model-wide sums (counts, norms).

    Summing a per-parameter quantity over these, then over the tensor and pipeline groups,
    counts every element of the model once: a tensor-parallel shard counts on its rank, a
    replicated parameter on tensor-parallel rank 0 only, and a tied copy on a later pipeline
    stage (DeepSpeed's `ds_pipe_replicated`) not at all. (DeepSpeed's own fp32 gradient
    clipping in the pipeline engine does not follow this rule for pp > 1.)
    """
    tp_rank = topology.tp_rank if topology is not None else 0
    return [
        p
        for p in model.parameters()
        if not getattr(p, "ds_pipe_replicated", False) and (is_tensor_parallel(p) or tp_rank == 0)
    ]


def count_model_parameters(model: torch.nn.Module, topology=None) -> int:
    """Unique parameters of the whole model, summed over tensor and pipeline ranks.

    Collective over the model-parallel ranks (call it on every rank); see `owned_parameters`.
    Data-parallel replicas are not summed; expert shards are summed over the expert-parallel
    group.
    """
    owned = owned_parameters(model, topology)
    local = sum(p.numel() for p in owned)
    if topology is None:
        return local
    experts = sum(p.numel() for p in owned if getattr(p, "expert_parallel", False))
    # each expert-parallel rank holds other experts
    local += int(reduce_host([experts], topology.ep_group)[0]) - experts
    for group in (topology.tp_group, topology.pp_group):
        local = int(reduce_host([local], group)[0])
    return local
