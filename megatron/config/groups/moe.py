"""Mixture-of-experts settings (`cfg.moe`), in GPT-NeoX's vocabulary.

`moe_num_experts > 1` replaces the MLP of every `moe_expert_interval`-th transformer layer
(layer `i`, 0-based, when `i % moe_expert_interval == 0`, as GPT-NeoX counts) with a routed
mixture of experts (`megatron/model/moe.py`). Defaults are GPT-NeoX's. `validate_moe` refuses
the values that are not built, naming the key and what would be valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from megatron.config.schema import ConfigError


@dataclass(frozen=True)
class MoEConfig:
    moe_num_experts: int = 1
    """Experts per MoE layer; 1 keeps every MLP dense."""

    moe_expert_interval: int = 1
    """Transformer layer `i` (0-based) is a MoE layer when `i % moe_expert_interval == 0`:
    1 (GPT-NeoX's default) gives every layer experts, 2 layers 0, 2, 4, ... GPT-NeoX's older
    name `expert_interval` (same rule, default 2 there) is read as this key."""

    moe_type: Literal["megablocks", "deepspeed"] = "megablocks"
    """GPT-NeoX's MoE implementation. Only `megablocks` (the default: routed experts without
    DeepSpeed's MoE layer) is built; `deepspeed` (DeepSpeed's MoE layer, with PR-MoE via
    `moe_use_residual`) is refused."""

    moe_top_k: int = 1
    """Experts each token is sent to (token-choice routing)."""

    moe_router_type: Literal["sinkhorn", "topk"] = "sinkhorn"
    """`topk`: softmax over the router logits, then the top-k experts. `sinkhorn` (GPT-NeoX's
    default, Megatron's Sinkhorn router): in training the experts are chosen by top-k of the
    Sinkhorn-balanced logits (GPT-NeoX's balancing: at most 3 rounds) and weighted by sigmoid
    (k = 1) or softmax (k > 1) of the raw logits; in evaluation plain top-k of those. The
    load-balancing loss applies to `topk` only (Sinkhorn balances the choices itself, as in
    Megatron)."""

    moe_router_weights: Literal["softmax", "softmax_renormalized", "topk_softmax"] = "softmax"
    """How a `topk` router weights its k experts: `softmax` (GPT-NeoX, Switch): the experts'
    softmax probabilities over all experts, not renormalised; `softmax_renormalized`
    (Mixtral): those probabilities divided by their sum over the k chosen; `topk_softmax`:
    softmax over the k chosen logits only (equal to `softmax_renormalized`)."""

    moe_lbl_in_fp32: bool = False
    """Compute the router softmax and the load-balancing/z losses in fp32."""

    moe_jitter_eps: float | None = None
    """In training, multiply the router's input by uniform noise in [1 - eps, 1 + eps]
    (`topk` router); null: no jitter."""

    moe_glu: bool = False
    """Gated experts: `act(x W_gate) * (x W_up)`. Experts are also gated when the model's
    activation is a GLU (swiglu, geglu, ...)."""

    moe_token_dropping: bool = False
    """Drop the assignments beyond each expert's capacity (see the capacity keys); false
    (GPT-NeoX's default) is dropless: every routed token is computed."""

    moe_use_residual: bool = True
    """PR-MoE residual MLP of `moe_type: deepspeed`. GPT-NeoX's `megablocks` layers do not
    read it, so it has no effect here (the `deepspeed` type is refused)."""

    moe_train_capacity_factor: float = 1.0
    """Capacity per expert in training, with token dropping:
    `max(moe_min_capacity, ceil(tokens * top_k / experts * factor))`, tokens per rank."""

    moe_eval_capacity_factor: float = 1.0
    """Capacity factor in evaluation (see `moe_train_capacity_factor`)."""

    moe_min_capacity: int = 4
    """Smallest capacity per expert, with token dropping."""

    moe_aux_loss_coeff: float = 0.1
    """Weight of the Switch load-balancing loss `E * sum_e f_e * P_e` (f_e: fraction of the
    top-k assignments to expert e, P_e: mean router probability of e), per MoE layer."""

    moe_z_loss_coeff: float = 0.0
    """Weight of the ST-MoE router z-loss `mean(logsumexp(router logits)^2)`, per MoE layer."""

    moe_expert_parallel_size: int = 1
    """Ranks the experts are sharded over: groups of this many data-parallel ranks (it must
    divide the data-parallel size and the number of experts). Above 1, each rank holds
    `moe_num_experts / moe_expert_parallel_size` experts of every MoE layer; it combines with
    tensor and pipeline parallelism, ZeRO stages 1 and 2 (each expert's weights, gradients
    and optimizer state partitioned over the ranks holding that expert) and checkpoints
    (resumed at the same value); ZeRO-3, bf16 on the pipeline engine and the optimizers Distro
    and OneBitAdam are refused."""

    enable_expert_tensor_parallelism: bool = False
    """Shard each expert over the tensor-parallel ranks. Not built: experts are whole on each
    rank of their expert-parallel group (true is refused)."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate_moe(cfg) -> None:
    """Refuse MoE values that are not built or do not fit the parallel layout."""
    m, e = cfg.moe, cfg.moe.moe_num_experts
    _check(isinstance(e, int) and e >= 1, f"moe_num_experts must be >= 1, got {e!r}")
    if e == 1:
        return
    _check(
        m.moe_type == "megablocks",
        f"moe_type '{m.moe_type}' is not built; use moe_type: megablocks (the default)",
    )
    _check(
        1 <= m.moe_top_k <= e,
        f"moe_top_k {m.moe_top_k} must be between 1 and moe_num_experts ({e})",
    )
    interval = m.moe_expert_interval
    _check(
        isinstance(interval, int) and interval >= 1,
        f"moe_expert_interval must be an integer >= 1, got {interval!r}",
    )
    _check(
        not m.enable_expert_tensor_parallelism,
        "enable_expert_tensor_parallelism: true is not built; experts are replicated over "
        "tensor-parallel ranks here (set it to false)",
    )
    _check(m.moe_min_capacity >= 1, f"moe_min_capacity must be >= 1, got {m.moe_min_capacity}")
    for key in ("moe_train_capacity_factor", "moe_eval_capacity_factor"):
        _check(getattr(m, key) > 0, f"{key} must be > 0, got {getattr(m, key)}")
    jitter = m.moe_jitter_eps
    _check(jitter is None or 0 <= jitter < 1, f"moe_jitter_eps must be in [0, 1), got {jitter}")
    ep, dp = m.moe_expert_parallel_size, cfg.parallel.data_parallel_size
    _check(
        ep >= 1 and e % ep == 0, f"moe_expert_parallel_size {ep} must divide moe_num_experts {e}"
    )
    _check(
        dp is None or dp % ep == 0,
        f"moe_expert_parallel_size {ep} must divide the data-parallel size {dp}",
    )
    _check(
        not cfg.parallel.sequence_parallel,
        "sequence_parallel with moe_num_experts > 1 is not built; set sequence_parallel: false",
    )
    _check(
        cfg.precision.dtype != "fp16",
        "moe_num_experts > 1 with fp16 is not built (the router losses are not loss-scaled); "
        "use bf16 or fp32",
    )
    if ep > 1:
        _validate_expert_parallel(cfg, ep)


# Optimizers that replace the engine's gradient all-reduce with an exchange of their own
# (over the whole data-parallel group, which would mix different experts).
_OWN_EXCHANGE = ("Distro", "OneBitAdam")


def _validate_expert_parallel(cfg, ep: int) -> None:
    """Refuse what `moe_expert_parallel_size > 1` does not support (see the field's docstring)."""
    stage = cfg.parallel.zero_stage
    _check(
        stage != 3,
        f"moe_expert_parallel_size {ep} with zero_optimization.stage 3 is not built: "
        "DeepSpeed's ZeRO-3 partitions every parameter over the whole data-parallel group "
        "(it keeps experts apart only for its own AutoEP layers), which would mix different "
        "experts; use zero_optimization.stage 1 or 2, or moe_expert_parallel_size 1",
    )
    zero = cfg.parallel.zero_optimization or {}
    for key in ("reduce_scatter",) + (("contiguous_gradients",) if stage == 2 else ()):
        _check(
            stage == 0 or zero.get(key, True) is not False,
            f"moe_expert_parallel_size {ep} with zero_optimization.{key} false is not built: "
            f"DeepSpeed's ZeRO-{stage} reduces expert gradients only with it on; remove "
            f"zero_optimization.{key} or set it to true",
        )
    _check(
        not (cfg.parallel.pipe_parallel_size >= 1 and cfg.precision.dtype == "bf16"),
        f"moe_expert_parallel_size {ep} with bf16 on the pipeline engine is not built: "
        "DeepSpeed's pipeline bf16 optimizer partitions the weights over the data-parallel "
        "group; use fp32, pipe_parallel_size 0 or moe_expert_parallel_size 1",
    )
    kind = cfg.optimizer.optimizer_type
    _check(
        kind not in _OWN_EXCHANGE,
        f"moe_expert_parallel_size {ep} with optimizer type {kind} is not built: it replaces "
        "the data-parallel gradient all-reduce, which must leave the experts to their "
        f"expert-data-parallel group; use another optimizer (not {', '.join(_OWN_EXCHANGE)}) "
        "or moe_expert_parallel_size 1",
    )
