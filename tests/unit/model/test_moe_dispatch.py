"""The MoE layer's dispatch (`megatron/model/moe_dispatch.py`) against a dense formula written
here, in fp64: every token through every expert, each token's chosen (and kept) experts'
outputs weighted and summed. Outputs and gradients (input, router, every expert weight) must
agree for top-k and Sinkhorn routing, dropless and with token dropping, and with the experts
split over two expert-parallel ranks (each rank's share computed by its own `Experts`).

The layer's host reads are counted (`tests/device_costs.py::HostReads`) around a forward and
backward: none with token dropping (fixed-size buffers), one per MoE layer per forward
dropless (the per-expert counts), none for the router losses (kept on the device)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from megatron.model import build_gpt
from megatron.model.moe import Experts, MoEMLP, moe_layers
from megatron.model.moe_dispatch import capacity_dispatch, dropless_dispatch
from megatron.model.moe_router import capacity_keep
from tests.device_costs import HostReads
from tests.unit.model.test_moe import E, H, K
from tests.unit.model.test_moe import moe_args as toy_moe_args
from tests.unit.model.tiny import SEQ

ROUTINGS = {
    "topk-dropless": dict(moe_router_type="topk"),
    "sinkhorn-dropless": dict(moe_router_type="sinkhorn"),
    "topk-dropping": dict(moe_router_type="topk", moe_token_dropping=True),
    "sinkhorn-dropping": dict(moe_router_type="sinkhorn", moe_token_dropping=True),
    "swiglu-dropping": dict(activation="swiglu", use_bias_in_mlp=False, moe_token_dropping=True),
}
DROPPING = dict(moe_min_capacity=1, moe_train_capacity_factor=0.5)  # drops some choices


def moe_args(**overrides):
    """`test_moe.py`'s toy (experts on layers 0 and 2 of 4, no dropout) without the router
    losses, with `DROPPING`'s capacity."""
    losses_off = dict(moe_aux_loss_coeff=0.0, moe_z_loss_coeff=0.0)
    return toy_moe_args(**{**losses_off, **DROPPING, **overrides})


def dense_expert(ex, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert `e` on tokens `(n, h)`: gelu(x W_in^T + b_in) W_out^T + b_out, or the SwiGLU
    silu(x W_gate^T) * (x W_in^T) W_out^T, written out."""
    if ex.gated:
        inner = F.silu(x @ ex.w_gate[e].t()) * (x @ ex.w_in[e].t())
        return inner @ ex.w_out[e].t()
    inner = F.gelu(x @ ex.w_in[e].t() + ex.b_in[e])
    return inner @ ex.w_out[e].t() + ex.b_out[e]


def queue_keep(indices: torch.Tensor, capacity: int) -> torch.Tensor:
    """Bool `(T, k)`: first choices of all tokens, then second choices, each in token order,
    kept while their expert has taken fewer than `capacity`."""
    taken, keep = [0] * E, torch.zeros(indices.shape, dtype=torch.bool)
    for j in range(indices.shape[1]):
        for t in range(indices.shape[0]):
            e = int(indices[t, j])
            keep[t, j] = taken[e] < capacity
            taken[e] += 1
    return keep


def dense_output(experts_of, tokens, indices, weights, keep) -> torch.Tensor:
    """Per token, the sum over its kept choices of weight * expert(token); `experts_of(e)`
    gives the `Experts` module holding global expert `e` and its local index."""
    every = []
    for e in range(E):
        ex, local = experts_of(e)
        every.append(dense_expert(ex, local, tokens))
    every = torch.stack(every)  # (E, T, h): every token through every expert
    picked = every[indices, torch.arange(tokens.shape[0])[:, None]]  # (T, k, h)
    return (picked * (weights * keep).unsqueeze(-1)).sum(dim=1)


def _capacity(tokens: int) -> int:
    return max(1, math.ceil(tokens * K / E * 0.5))


def _grads(outputs, tensors, seed: int = 5):
    """Gradients of `sum(outputs * g)` for a fixed random `g` (the same for both sides)."""
    g = torch.randn(
        outputs.shape, generator=torch.Generator().manual_seed(seed), dtype=outputs.dtype
    )
    return torch.autograd.grad((outputs * g).sum(), tensors)


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_layer_matches_the_dense_formula_with_gradients_in_fp64(name):
    torch.manual_seed(3)
    layer = MoEMLP(moe_args(**ROUTINGS[name])).double()
    x = torch.randn(SEQ, 2, H, dtype=torch.float64, requires_grad=True)
    params = [x, layer.router.weight, *layer.experts.parameters()]
    got = layer(x)
    got_grads = _grads(got, params)
    tokens = x.reshape(-1, H)
    route = layer.router(tokens)  # the same routing (no jitter, Sinkhorn is deterministic)
    keep = torch.ones_like(route.indices, dtype=torch.bool)
    if layer.dropping:
        keep = queue_keep(route.indices, _capacity(tokens.shape[0]))
        assert not keep.all()  # the test drops something
    expected = dense_output(
        lambda e: (layer.experts, e), tokens, route.indices, route.weights, keep
    )
    torch.testing.assert_close(got, expected.view_as(x), rtol=1e-12, atol=1e-12)
    for a, b in zip(got_grads, _grads(expected.view_as(x), params)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dropping", [False, True], ids=["dropless", "dropping"])
def test_two_expert_parallel_ranks_together_give_the_dense_formula(dropping):
    """The group's gathered tokens (two ranks' worth, dropped per source rank) through each
    rank's half of the experts; the two ranks' outputs summed are the dense result."""
    torch.manual_seed(6)
    args = moe_args()
    ranks = [Experts(args, 2, r).double() for r in range(2)]
    per_rank = 12
    tokens = torch.randn(2 * per_rank, H, dtype=torch.float64)
    probs = torch.randn(2 * per_rank, E, dtype=torch.float64).softmax(-1)
    weights, indices = probs.topk(K, dim=-1)
    keep = torch.ones_like(indices, dtype=torch.bool)
    if dropping:  # each source rank drops over its own capacity
        halves = indices.split(per_rank)
        keep = torch.cat([queue_keep(half, _capacity(per_rank)) for half in halves])
        assert not keep.all()
    routed = torch.where(keep, indices, -1)
    total = torch.zeros_like(tokens)
    for ex in ranks:
        if dropping:
            total += capacity_dispatch(ex, tokens, routed, weights, 2 * _capacity(per_rank))
        else:
            total += dropless_dispatch(ex, tokens, routed, weights, torch.zeros_like(tokens))
    half = E // 2
    expected = dense_output(lambda e: (ranks[e // half], e % half), tokens, indices, weights, keep)
    torch.testing.assert_close(total, expected, rtol=1e-12, atol=1e-12)


def test_capacity_keep_is_the_queue_rule():
    indices = torch.randint(0, E, (40, K))
    torch.testing.assert_close(capacity_keep(indices, E, 7), queue_keep(indices, 7))


@pytest.mark.parametrize(
    "name, per_forward",
    [
        ("topk-dropless", 1),
        ("sinkhorn-dropless", 1),
        ("topk-dropping", 0),
        ("sinkhorn-dropping", 0),
    ],
)
def test_a_model_forward_and_backward_reads_at_most_one_count_per_moe_layer(name, per_forward):
    """Two MoE layers, router losses on: dropless reads each layer's per-expert counts once;
    with token dropping nothing is read (no nonzero per expert, no bincount, no loss value)."""
    torch.manual_seed(0)
    args = moe_args(moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01, **ROUTINGS[name])
    model = build_gpt(args)
    assert len(moe_layers(model)) == 2
    tokens = torch.randint(0, args.vocab_size, (2, SEQ))
    positions = torch.arange(SEQ)[None]
    with HostReads() as reads:
        loss = model.loss_fn(model(tokens, positions), (tokens, torch.ones(2, SEQ)))
        loss.backward()
    assert reads.count == 2 * per_forward, reads.report()
    assert all(layer.moe_loss_sums["n"] == 1 for layer in moe_layers(model))
