"""The mixture-of-experts MLP, sharded over the expert-parallel group.

`MoEMLP` replaces the MLP of the transformer layers `i` with `i % moe_expert_interval == 0`
(`is_moe_layer`). Layout `(s, b, h) -> (s, b, h)`, like the dense MLP:

1. the router (`moe_router.py`) picks `k` experts and weights for each of this rank's tokens;
   with `moe_token_dropping`, the assignments beyond an expert's capacity are dropped;
2. the expert-parallel group's tokens, choices and weights are all-gathered (gloo and NCCL
   both have it; its backward reduce-scatters the gradients back, once per layer on every
   rank of the group, so the ranks' collectives always pair up);
3. each rank runs its `E / ep` experts (`experts.w_in` ... stacked `(E/ep, ...)`) on the
   gathered tokens that chose them and adds `weight * expert(x)` into a `(ep*T, h)` buffer
   (`moe_dispatch.py`: with token dropping in fixed-size buffers, without any host read;
   dropless with one read of the per-expert counts);
4. the buffer is reduce-scattered over the group: each rank gets its tokens' sums.

Experts are whole on each rank (not tensor-parallel): with tensor parallelism every rank of a
tensor-parallel group computes the same experts on the same (replicated) tokens. Expert
parameters carry `expert_parallel = True`. With `ep > 1` they also carry `allreduce = False`
and `group_name` (DeepSpeed's marks for MoE parameters, so its dense gradient all-reduce
leaves them out) and their gradients are averaged over the expert-data-parallel group by
`megatron/training/step/moe_grads.py`; with `ep = 1` every rank holds every expert and they are
ordinary replicated parameters (DeepSpeed only handles its own MoE modules' marks).
Full weights are initialised per expert from the layer's seed and each rank keeps its
slice, so a seed gives the same model at any `ep`.

The router losses (`moe_aux_loss_coeff * load_balancing_loss + moe_z_loss_coeff *
router_z_loss`) enter training through `AuxLossGradient`: the layer output passes through it
unchanged and its backward gives the losses the gradient `aux_grad_scale` (the engine's
`1 / gradient_accumulation_steps`, set by the step driver), so every pipeline stage
backpropagates its own layers' losses with the language-model loss. Their values are summed
on the device (`moe_loss_sums`, fp64 0-dim tensors) for logging: the log reads them, never a
forward.
"""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.activations import build_activation
from megatron.model.args import ModelArgs
from megatron.model.init_methods import input_init, output_init
from megatron.model.mlp import build_mlp, mlp_inner_size
from megatron.model.moe_dispatch import capacity_dispatch, dropless_dispatch
from megatron.model.moe_router import (
    ROUTERS,
    capacity_keep,
    expert_capacity,
    load_balancing_loss,
    router_z_loss,
)
from megatron.parallel.comm import group_rank, group_size
from megatron.parallel.mappings import (
    gather_from_sequence_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)


def is_moe_layer(args: ModelArgs, layer_index: int) -> bool:
    """Whether transformer layer `layer_index` (0-based) has experts (GPT-NeoX's rule; a
    block layer such as `mamba` has no MLP for them)."""
    return (
        args.moe_num_experts > 1
        and layer_index % args.moe_expert_interval == 0
        and not args.is_block_layer(layer_index)
    )


def build_layer_mlp(args: ModelArgs, layer_index: int, tp_group=None, ep_group=None):
    """The MLP of transformer layer `layer_index`: `MoEMLP` or the dense MLP."""
    if is_moe_layer(args, layer_index):
        return MoEMLP(args, ep_group)
    return build_mlp(args, tp_group)


def expert_group_name(ep_size: int) -> str:
    """DeepSpeed's name of the expert groups of an expert-parallel size."""
    return f"ep_size_{ep_size}"


class AuxLossGradient(torch.autograd.Function):
    """Identity on `output`; backward also gives `aux` the gradient `scale`."""

    @staticmethod
    def forward(ctx, output, aux, scale: float):
        ctx.scale = scale
        ctx.aux_shape = aux.shape
        ctx.aux_dtype, ctx.aux_device = aux.dtype, aux.device
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad):
        scale = torch.full(ctx.aux_shape, ctx.scale, dtype=ctx.aux_dtype, device=ctx.aux_device)
        return grad, scale, None


def _expert_weight(n: int, rows: int, cols: int, init, first: int, local: int) -> nn.Parameter:
    """`(local, rows, cols)`: experts `first .. first+local` of `n`, each initialised whole."""
    full = torch.empty(n, rows, cols)
    for e in range(n):
        init(full[e])
    return nn.Parameter(full[first : first + local].clone())


class Experts(nn.Module):
    """This rank's experts, weights stacked: `w_in`/`w_gate` `(E/ep, ffn, h)`, `w_out`
    `(E/ep, h, ffn)`, biases `b_in`/`b_gate` `(E/ep, ffn)`, `b_out` `(E/ep, h)`."""

    def __init__(self, args: ModelArgs, ep_size: int, ep_rank: int):
        super().__init__()
        n, h, ffn = args.moe_num_experts, args.hidden_size, mlp_inner_size(args)
        self.local = n // ep_size
        self.first = ep_rank * self.local
        self.activation = build_activation(args.activation)
        self.gated = self.activation.gated or args.moe_glu
        names = ["in", "gate"] if self.gated else ["in"]
        for name in names:
            w = _expert_weight(n, ffn, h, input_init(args), self.first, self.local)
            self.register_parameter(f"w_{name}", w)
        self.w_out = _expert_weight(n, h, ffn, output_init(args), self.first, self.local)
        self.bias = args.use_bias_in_mlp
        if self.bias:
            for name in names:
                self.register_parameter(f"b_{name}", nn.Parameter(torch.zeros(self.local, ffn)))
            self.b_out = nn.Parameter(torch.zeros(self.local, h))
        for p in self.parameters():
            p.expert_parallel = True
            if ep_size > 1:  # DeepSpeed's MoE marks: broadcast over the expert-data group
                p.allreduce = False
                p.group_name = expert_group_name(ep_size)

    def _linear(self, x, name: str, e: int):
        w = getattr(self, f"w_{name}")[e]
        bias = getattr(self, f"b_{name}")[e] if self.bias else None
        return nn.functional.linear(x, w, bias)

    def _batched(self, x, name: str):
        """`x @ w.T + b` for every local expert at once: `(E/ep, n, in) -> (E/ep, n, out)`."""
        y = torch.matmul(x, getattr(self, f"w_{name}").transpose(1, 2))
        return y + getattr(self, f"b_{name}").unsqueeze(1) if self.bias else y

    def _mlp(self, linear, x):
        if self.activation.gated:
            inner = self.activation(linear(x, "gate"), linear(x, "in"))
        elif self.gated:  # moe_glu with a plain activation: act(gate) * up
            inner = self.activation(linear(x, "gate")) * linear(x, "in")
        else:
            inner = self.activation(linear(x, "in"))
        return linear(inner, "out")

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Local expert `e` (0-based on this rank) on tokens `(n, h)`."""
        return self._mlp(lambda t, name: self._linear(t, name, e), x)

    def batched(self, x: torch.Tensor) -> torch.Tensor:
        """Every local expert on its own tokens: `(E/ep, n, h) -> (E/ep, n, h)`."""
        return self._mlp(self._batched, x)


class MoEMLP(nn.Module):
    """Router plus this rank's experts (module docstring)."""

    def __init__(self, args: ModelArgs, ep_group=None):
        super().__init__()
        self.ep_group = ep_group
        ep, rank = group_size(ep_group), group_rank(ep_group)
        self.num_experts, self.top_k = args.moe_num_experts, args.moe_top_k
        self.router = ROUTERS[args.moe_router_type](
            args.hidden_size,
            args.moe_num_experts,
            args.moe_top_k,
            fp32=args.moe_lbl_in_fp32,
            jitter_eps=args.moe_jitter_eps,
            weights=args.moe_router_weights,
        )
        input_init(args)(self.router.weight)
        self.experts = Experts(args, ep, rank)
        self.dropping = args.moe_token_dropping
        self.capacity_factors = (args.moe_train_capacity_factor, args.moe_eval_capacity_factor)
        self.min_capacity = args.moe_min_capacity
        self.aux_coeff = args.moe_aux_loss_coeff if args.moe_router_type == "topk" else 0.0
        self.z_coeff = args.moe_z_loss_coeff
        self.aux_grad_scale = 1.0
        self.reset_loss_sums()

    def reset_loss_sums(self) -> None:
        """Start a new count of `moe_loss_sums`: `{"aux": sum, "z": sum, "n": forwards}` (the
        sums 0.0 until a forward makes them fp64 device tensors)."""
        self.moe_loss_sums = {"aux": 0.0, "z": 0.0, "n": 0}

    def capacity(self, tokens: int) -> int:
        factor = self.capacity_factors[0 if self.training else 1]
        return expert_capacity(tokens, self.top_k, self.num_experts, factor, self.min_capacity)

    def _losses(self, route) -> torch.Tensor:
        aux = self.aux_coeff * load_balancing_loss(route.probs, route.indices)
        z = self.z_coeff * router_z_loss(route.logits)
        sums = self.moe_loss_sums
        sums["aux"] = sums["aux"] + aux.detach().double()  # on the device: no read per forward
        sums["z"] = sums["z"] + z.detach().double()
        sums["n"] += 1
        return aux + z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        route = self.router(tokens)
        losses = self._losses(route)
        indices, weights = route.indices, route.weights.to(x.dtype)
        capacity = None
        if self.dropping:
            capacity = self.capacity(tokens.shape[0])
            keep = capacity_keep(indices, self.num_experts, capacity)
            indices = torch.where(keep, indices, -1)
        out = self._run_experts(tokens, indices, weights, capacity).view(shape)
        if self.training and torch.is_grad_enabled() and (self.aux_coeff or self.z_coeff):
            out = AuxLossGradient.apply(out, losses, self.aux_grad_scale)
        return out

    def _run_experts(self, tokens, indices, weights, capacity=None) -> torch.Tensor:
        """`(T, h)`: step 2-4 of the module docstring; `capacity` with token dropping."""
        group, h = self.ep_group, tokens.shape[-1]
        # Tokens and weights travel as one tensor, so the backward is one reduce-scatter per
        # layer on every rank of the group, whichever experts its tokens chose (two, left to
        # the autograd engine's order, could pair up differently on different ranks).
        packed = torch.cat([tokens, weights], dim=-1)  # (T, h + k)
        packed = gather_from_sequence_parallel_region(packed, group)  # (ep*T, h + k)
        tokens, weights = packed[:, :h], packed[:, h:]
        with torch.no_grad():
            indices = gather_from_sequence_parallel_region(indices, group)
        if capacity is not None:  # every source rank kept at most `capacity` per expert
            slots = group_size(group) * capacity
            out = capacity_dispatch(self.experts, tokens, indices, weights, slots)
        else:
            # `tokens * 0`: the output depends on the gather even on a rank whose experts got
            # no token, so that rank still joins the reduce-scatter of the backward.
            out = tokens * 0 if group_size(group) > 1 else torch.zeros_like(tokens)
            out = dropless_dispatch(self.experts, tokens, indices, weights, out)
        return reduce_scatter_to_sequence_parallel_region(out, group)


def moe_layers(model: nn.Module) -> list[MoEMLP]:
    """The MoE MLPs of a model (in module order)."""
    return [m for m in model.modules() if isinstance(m, MoEMLP)]
