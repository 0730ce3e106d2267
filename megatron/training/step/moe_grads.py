"""Mixture-of-experts plumbing around the DeepSpeed engine: expert gradients and router losses.

Expert parameters (`megatron/model/moe.py`) differ between the ranks of an expert-parallel
group, so they must not join the data-parallel gradient average. They carry DeepSpeed's MoE
marks (`allreduce = False`, `group_name`), which make its start-up broadcast use the
expert-data-parallel group (`register_expert_groups` hands our groups to DeepSpeed before
`deepspeed.initialize`).

Their gradients are reduced here, not by DeepSpeed: DeepSpeed's own MoE reduction runs only
when its engine found DeepSpeed MoE modules (`has_moe_layers`), and that flag also switches
its checkpointing to per-expert files of those modules, which would drop our experts; with
the flag off, its `allreduce_gradients` cannot sort parameters marked `allreduce = False`
(a KeyError in DeepSpeed 0.19.8). `install_expert_grad_reduction` therefore replaces that
method: at the accumulation boundary the dense gradients go through DeepSpeed's bucketed
data-parallel all-reduce (`buffered_allreduce_fallback` with an explicit list), and each
expert gradient is summed over the expert-data-parallel group (the ranks holding the same
experts) and divided by the data-parallel size, since it already sums the contributions of
its expert-parallel group's tokens. This is the dense model's data-parallel average and
DeepSpeed's `_reduce_expert_gradients` rule. It covers the engines without ZeRO (the config
refuses ZeRO-3, the pipeline engine's bf16 optimizer and the optimizers with their own
exchange at `moe_expert_parallel_size > 1`).

Under ZeRO stages 1 and 2 DeepSpeed's optimizer does the expert work itself once it is told
which parameter groups are experts: `expert_param_groups` moves the experts into DeepSpeed's
MoE parameter groups (`moe: True`, `name`: the expert group name; DeepSpeed's own
`split_params_into_different_moe_groups_for_optimizer`), and `zero_partitions_experts`
builds the ZeRO optimizer with `has_moe_layers` on (the engine's flag stays off, so the
checkpoints stay ours). That optimizer partitions each expert group over the
expert-data-parallel group instead of the data-parallel group, reduces its gradients there
after dividing by the data-parallel size (the same rule), and sums the gradient norm over
the data-parallel group, whose partitions together hold every expert once. Its per-rank
`zero_pp_rank_*` files then hold each rank's own expert partitions of the fp32 weights and
optimizer state.

`prepare_moe_step` gives the router losses the engine's gradient-accumulation scale, and
`moe_loss_record` gives their values for the log (summed over layers and pipeline stages,
averaged over forwards and data-parallel ranks) as device tensors, reduced on the device: no
host round trip per step.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from deepspeed.runtime.engine import MEMORY_OPT_ALLREDUCE_SIZE

from megatron.model.moe import expert_group_name, moe_layers
from megatron.parallel.comm import all_reduce


def expert_parameters(model) -> list[torch.nn.Parameter]:
    """Parameters marked as experts (sharded over the expert-parallel group)."""
    return [p for p in model.parameters() if getattr(p, "expert_parallel", False)]


def register_expert_groups(topology) -> None:
    """Tell DeepSpeed's group registry about this topology's expert groups."""
    from deepspeed.utils import groups

    if not topology._groups:
        return
    name = expert_group_name(topology.ep_size)
    groups._EXPERT_PARALLEL_GROUP[name] = topology._group("expert")
    groups._EXPERT_PARALLEL_GROUP_RANKS[name] = list(topology.ep_ranks)
    groups._EXPERT_DATA_PARALLEL_GROUP[name] = topology._group("expert_data")
    groups._EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = list(topology.edp_ranks)


def reduce_expert_gradients(params, topology) -> None:
    """Average expert gradients as the dense model would (see the module docstring)."""
    if topology.dp_size == 1:
        return
    group = topology._group("expert_data")
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if group is not None and len(topology.edp_ranks) > 1:
            all_reduce(p.grad.data, group)
        p.grad.data.div_(topology.dp_size)


def _dense_gradients(model) -> list[torch.Tensor]:
    """Gradients of the replicated parameters (zeros where a rank got none, as DeepSpeed
    does, so every data-parallel rank reduces the same buffers)."""
    grads = []
    for p in model.parameters():
        if not p.requires_grad or p.numel() == 0 or getattr(p, "expert_parallel", False):
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad.data)
    return grads


# The ZeRO stages whose optimizer (`DeepSpeedZeroOptimizer`) keeps MoE parameter groups apart.
ZERO_EXPERT_STAGES = (1, 2)


def _is_moe_param(p) -> bool:
    return getattr(p, "expert_parallel", False) and getattr(p, "allreduce", True) is False


def expert_param_groups(groups: list[dict], zero_stage: int) -> list[dict]:
    """`groups` with the experts moved into DeepSpeed's MoE parameter groups under ZeRO-1/2
    (module docstring); unchanged otherwise or without expert parallelism."""
    if zero_stage not in ZERO_EXPERT_STAGES or not any(
        _is_moe_param(p) for g in groups for p in g["params"]
    ):
        return groups
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    split = split_params_into_different_moe_groups_for_optimizer([dict(g) for g in groups])
    return [g for g in split if g["params"]]  # DeepSpeed rejects empty groups


@contextmanager
def zero_partitions_experts(zero_stage: int):
    """Around `deepspeed.initialize`: build a ZeRO-1/2 optimizer whose parameter groups hold
    experts (`expert_param_groups`) with DeepSpeed's MoE handling on.

    DeepSpeed turns that handling on only when the engine found its own MoE modules
    (`has_moe_layers`), a flag that also switches the engine's checkpoints to files of those
    modules; it is therefore set for the optimizer's construction alone.
    """
    from deepspeed.runtime.engine import DeepSpeedEngine

    original = DeepSpeedEngine._configure_zero_optimizer

    def configure(engine, optimizer):
        found = engine.has_moe_layers
        groups = getattr(optimizer, "param_groups", [])
        engine.has_moe_layers = found or any(g.get("moe") for g in groups)
        try:
            return original(engine, optimizer)
        finally:
            engine.has_moe_layers = found

    if zero_stage in ZERO_EXPERT_STAGES:
        DeepSpeedEngine._configure_zero_optimizer = configure
    try:
        yield
    finally:
        DeepSpeedEngine._configure_zero_optimizer = original


def install_expert_grad_reduction(engine, model, topology) -> None:
    """Replace the engine's gradient reduction by a dense one plus the expert one (module
    docstring); nothing changes at `ep = 1`, where experts are ordinary replicated params,
    nor under ZeRO, whose optimizer reduces the experts' gradients itself."""
    params = expert_parameters(model)
    if not params or topology.ep_size == 1 or engine.zero_optimization_stage() > 0:
        return

    def allreduce_gradients(bucket_size=MEMORY_OPT_ALLREDUCE_SIZE):
        if not engine.is_gradient_accumulation_boundary():
            return
        grads = _dense_gradients(model)
        if grads and topology.dp_size > 1:
            engine.buffered_allreduce_fallback(grads=grads, elements_per_buffer=bucket_size)
        reduce_expert_gradients(params, topology)

    engine.allreduce_gradients = allreduce_gradients


def prepare_moe_step(model, gradient_accumulation_steps: int) -> None:
    """Scale the router losses' gradients like the engine scales the loss; reset the sums."""
    for layer in moe_layers(model):
        layer.aux_grad_scale = 1.0 / gradient_accumulation_steps
        layer.reset_loss_sums()


def moe_loss_record(model, topology) -> dict[str, torch.Tensor]:
    """`{"moe_aux_loss": ..., "moe_z_loss": ...}` of the last step as fp64 0-dim device tensors
    (collective over pipe and data ranks when the model has MoE layers; empty without).

    The sums stay on the device and are reduced there, so a step waits for nothing here; the
    log reads them with its losses, in its one transfer (`metrics/monitor.py`)."""
    if not getattr(getattr(model, "args", None), "moe_num_experts", 1) > 1:
        return {}
    device = next(model.parameters()).device  # a stage without MoE layers adds zeros
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # (aux, z)
    for layer in moe_layers(model):
        n = max(layer.moe_loss_sums["n"], 1)
        for i, key in enumerate(("aux", "z")):  # a float 0.0 before the layer's first forward
            sums[i] += layer.moe_loss_sums[key] / n
    for group in (topology.pp_group, topology.dp_group):
        all_reduce(sums, group)
    sums /= topology.dp_size
    return {"moe_aux_loss": sums[0], "moe_z_loss": sums[1]}
