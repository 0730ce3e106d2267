"""Mixture of experts in one process: routing, capacity, dropping, the router losses and their
gradients, against formulas written out independently here (loops over tokens and experts);
the layer placement, parameter counts and FLOPs against the model built and torch's counter."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.model import build_gpt
from megatron.model.counting import active_parameters, count_model_parameters, count_parameters
from megatron.model.moe import MoEMLP, is_moe_layer, moe_layers
from megatron.model.moe_router import (
    capacity_keep,
    expert_capacity,
    load_balancing_loss,
    router_z_loss,
    sinkhorn,
)
from megatron.training.metrics.flops import ModelShape, training_flops_per_token
from tests.flop_counter import flop_counter
from tests.unit.model.tiny import SEQ, neox_args

E, K, H = 4, 2, 32


def moe_args(**overrides):
    values = dict(
        moe_num_experts=E,
        moe_top_k=K,
        moe_router_type="topk",
        moe_expert_interval=2,  # experts on layers 0 and 2 of the 4-layer toy
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    values.update(overrides)
    return neox_args(**values)


def test_load_balancing_loss_is_switch_formula():
    torch.manual_seed(0)
    probs = torch.rand(10, E).softmax(-1)
    indices = probs.topk(K, dim=-1).indices
    expected = 0.0
    for e in range(E):
        f = sum(int(indices[t, j] == e) for t in range(10) for j in range(K)) / (10 * K)
        p = sum(float(probs[t, e]) for t in range(10)) / 10
        expected += f * p
    assert float(load_balancing_loss(probs, indices)) == pytest.approx(E * expected, rel=1e-6)


def test_router_z_loss_is_mean_squared_logsumexp():
    torch.manual_seed(1)
    logits = torch.randn(7, E)
    rows = [math.log(sum(math.exp(float(v)) for v in row)) ** 2 for row in logits]
    assert float(router_z_loss(logits)) == pytest.approx(sum(rows) / 7, rel=1e-6)


@pytest.mark.parametrize(
    "tokens, k, experts, factor, minimum, expected",
    [(32, 2, 4, 1.0, 4, 16), (32, 2, 4, 1.25, 4, 20), (5, 1, 4, 1.0, 4, 4), (30, 2, 8, 1.0, 1, 8)],
)
def test_capacity(tokens, k, experts, factor, minimum, expected):
    assert expert_capacity(tokens, k, experts, factor, minimum) == expected


def test_capacity_keeps_first_choices_first_in_token_order():
    indices = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0], [2, 0]])
    queue = {e: 0 for e in range(E)}
    expected = torch.zeros(5, 2, dtype=torch.bool)
    for j in range(2):  # all first choices, then all second choices
        for t in range(5):
            e = int(indices[t, j])
            expected[t, j] = queue[e] < 2
            queue[e] += 1
    assert torch.equal(capacity_keep(indices, E, 2), expected)


def _reference_output(layer: MoEMLP, x: torch.Tensor, keep=None) -> torch.Tensor:
    """Per token, sum over its kept choices of weight * expert(token), written out."""
    ex = layer.experts
    tokens = x.reshape(-1, x.shape[-1])
    logits = tokens @ layer.router.weight.t()
    out = torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        probs = torch.softmax(logits[t], dim=-1)
        top = torch.topk(probs, K)
        for j in range(K):
            if keep is not None and not keep[t, j]:
                continue
            e = int(top.indices[j])
            hidden = torch.nn.functional.gelu(ex.w_in[e] @ tokens[t] + ex.b_in[e])
            out[t] += top.values[j] * (ex.w_out[e] @ hidden + ex.b_out[e])
    return out.view_as(x)


def _layer(**overrides) -> MoEMLP:
    torch.manual_seed(3)
    return MoEMLP(moe_args(**overrides))


def test_dropless_layer_computes_every_choice():
    layer = _layer(moe_token_dropping=False, moe_min_capacity=1)
    x = torch.randn(SEQ, 2, H)
    torch.testing.assert_close(layer(x), _reference_output(layer, x), rtol=1e-5, atol=1e-6)


def test_dropping_layer_leaves_out_choices_over_capacity():
    layer = _layer(moe_token_dropping=True, moe_min_capacity=1, moe_train_capacity_factor=0.5)
    x = torch.randn(SEQ, 2, H)
    indices = (x.reshape(-1, H) @ layer.router.weight.t()).topk(K, dim=-1).indices
    capacity = max(1, math.ceil(2 * SEQ * K / E * 0.5))
    counts, keep = [0] * E, torch.zeros(2 * SEQ, K, dtype=torch.bool)
    for j in range(K):
        for t in range(2 * SEQ):
            keep[t, j] = counts[int(indices[t, j])] < capacity
            counts[int(indices[t, j])] += 1
    assert not keep.all()  # the test drops something
    torch.testing.assert_close(layer(x), _reference_output(layer, x, keep), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rule", ["softmax_renormalized", "topk_softmax"])
def test_mixtral_weights_renormalise_the_top_k_softmax(rule):
    layer = _layer(moe_router_weights=rule)
    x = torch.randn(6, H)
    route = layer.router(x)
    logits = x @ layer.router.weight.t()
    top = logits.topk(K, dim=-1)  # Mixtral: softmax over all, top-k, renormalise
    expected = torch.softmax(logits, -1).gather(1, top.indices)
    expected = expected / expected.sum(-1, keepdim=True)
    torch.testing.assert_close(route.weights, expected)
    torch.testing.assert_close(route.weights, torch.softmax(top.values, -1))


def neox_sinkhorn(cost, tol=0.0001, max_iter=3):
    """GPT-NeoX's `SinkhornRouter.sinkhorn` (megatron/model/router.py), written out: d0 = 1,
    d1 = 1 / (E * column sums of exp(cost)), at most 3 rounds, stopping once the mean change
    of d1 is below tol."""
    cost = cost.exp()
    t, e = cost.shape
    d0 = [1.0] * t
    d1 = [1.0 / (e * float(cost[:, j].sum())) for j in range(e)]
    for _ in range(max_iter):
        d0 = [(1 / t) / (sum(d1[j] * float(cost[i, j]) for j in range(e)) + 1e-8) for i in range(t)]
        old = d1
        d1 = [(1 / e) / (sum(d0[i] * float(cost[i, j]) for i in range(t)) + 1e-8) for j in range(e)]
        if sum(abs(a - b) for a, b in zip(old, d1)) / e < tol:
            break
    return torch.tensor(d1, dtype=torch.float64) * cost.double() * torch.tensor(d0)[:, None]


@pytest.mark.parametrize("tol", [1e-4, 0.5])  # 0.5: GPT-NeoX stops after the first round
def test_sinkhorn_is_gpt_neox_at_most_three_rounds(tol):
    torch.manual_seed(4)
    logits = torch.randn(12, E) * 2
    torch.testing.assert_close(sinkhorn(logits, tol).double(), neox_sinkhorn(logits, tol))
    if tol == 0.5:  # the stop matters here: three rounds give other scales
        assert not torch.allclose(neox_sinkhorn(logits, tol), neox_sinkhorn(logits, 1e-4))


def test_sinkhorn_router_balances_in_training_and_takes_top_k_in_eval():
    layer = _layer(moe_router_type="sinkhorn")
    x = torch.randn(12, H)
    logits = (x @ layer.router.weight.t()).detach()
    balanced = neox_sinkhorn(logits)
    route = layer.router(x)
    assert torch.equal(route.indices.sort(-1).values, balanced.topk(K).indices.sort(-1).values)
    torch.testing.assert_close(route.weights, logits.softmax(-1).gather(1, route.indices))
    layer.eval()
    assert torch.equal(layer.router(x).indices, logits.softmax(-1).topk(K).indices)


def test_router_losses_reach_the_router_gradient():
    layer = _layer(moe_aux_loss_coeff=0.3, moe_z_loss_coeff=0.02)
    x = torch.randn(SEQ, 2, H)
    layer(x).sum().backward()
    got = layer.router.weight.grad.clone()
    layer.router.weight.grad = None
    tokens = x.reshape(-1, H)
    logits = tokens @ layer.router.weight.t()
    probs = logits.softmax(-1)
    top = probs.topk(K, -1).indices
    share = torch.stack([(top == e).sum() for e in range(E)]).float() / top.numel()
    lbl = E * (share * probs.mean(0)).sum()
    z = (torch.logsumexp(logits, -1) ** 2).mean()
    (_reference_output(layer, x).sum() + 0.3 * lbl + 0.02 * z).backward()
    torch.testing.assert_close(got, layer.router.weight.grad, rtol=1e-5, atol=1e-7)
    assert layer.moe_loss_sums["n"] == 1
    assert layer.moe_loss_sums["aux"] == pytest.approx(0.3 * float(lbl.detach()), rel=1e-5)


class _AtomicAddsRoundEachAdd(TorchDispatchMode):
    """CPU `scatter_add` sums a bf16 segment in fp32 and rounds once; CUDA's atomic adds round
    after every add (as CPU `index_add_` does). Run 1-D scatter-adds the CUDA way here."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        scatter = (torch.ops.aten.scatter_add_.default, torch.ops.aten.scatter_add.default)
        if func in scatter and args[0].dtype in (torch.bfloat16, torch.float16):
            target, dim, index, src = args
            if target.dim() == 1:
                out = target if func is scatter[0] else target.clone()
                return out.index_add_(dim, index, src)
        return func(*args, **kwargs)


def test_bf16_router_counts_every_assignment_past_256_per_expert():
    # bf16 holds integers exactly up to 256: a count kept in the router's dtype stops there.
    layer = _layer(moe_aux_loss_coeff=1.0, moe_z_loss_coeff=0.0, moe_lbl_in_fp32=False)
    layer.to(torch.bfloat16)
    x = torch.randn(1024, 2, H).to(torch.bfloat16)  # 2048 tokens, 4096 assignments
    with _AtomicAddsRoundEachAdd():
        layer(x)
    logits = torch.nn.functional.linear(x.reshape(-1, H), layer.router.weight)  # bf16, as run
    probs = logits.softmax(-1)
    chosen = probs.topk(K, dim=-1).indices.reshape(-1).tolist()
    counts = [chosen.count(e) for e in range(E)]
    assert min(counts) > 256
    mean_probs = probs.double().mean(0).tolist()
    expected = E * sum(c / len(chosen) * p for c, p in zip(counts, mean_probs))
    assert layer.moe_loss_sums["aux"] == pytest.approx(expected, rel=1e-2)


# GPT-NeoX's configs/125M-dmoe.yml, the keys that shape the model (values written here).
NEOX_125M_DMOE = """
pipe_parallel_size: 1
model_parallel_size: 1
num_layers: 12
hidden_size: 768
num_attention_heads: 12
seq_length: 2048
max_position_embeddings: 2048
norm: layernorm
pos_emb: rotary
no_weight_tying: true
gpt_j_residual: false
output_layer_parallelism: column
moe_num_experts: 8
init_method: small_init
output_layer_init_method: wang_init
train_micro_batch_size_per_gpu: 4
precision: bfloat16
optimizer: {type: Adam, params: {lr: 0.0006, betas: [0.9, 0.95], eps: 1.0e-8}}
train_iters: 320000
"""
NEOX_DEFAULT_INTERVAL = 1  # GPT-NeoX's neox_args.py: moe_expert_interval: int = 1


@pytest.mark.parametrize(
    "extra, interval",
    [
        ("", NEOX_DEFAULT_INTERVAL),
        ("moe_expert_interval: 3\n", 3),
        ("expert_interval: 2\n", 2),  # GPT-NeoX's name before its dMoE integration
    ],
    ids=["125M-dmoe", "moe_expert_interval-3", "old-name-expert_interval-2"],
)
def test_gpt_neox_125m_dmoe_builds_experts_where_gpt_neox_does(tmp_path, extra, interval):
    """GPT-NeoX's ParallelTransformerLayer(layer_number=i), i = 0 .. num_layers - 1 (its
    gpt2_model.py), has experts when `layer_number % moe_expert_interval == 0`."""
    import dataclasses

    from megatron.config import load_config
    from megatron.model.args import ModelArgs

    path = tmp_path / "125M-dmoe.yml"
    path.write_text(NEOX_125M_DMOE + extra)
    cfg = load_config([path], warn=[], vocab_size=50257, world_size=1)
    args = dataclasses.replace(ModelArgs.from_config(cfg), pipe_parallel_size=0)
    with torch.device("meta"):  # the shapes only: no memory for 12 layers of 8 experts
        model = build_gpt(args)
    first = 2  # the transformer layers follow the word and position embeddings (specs.py)
    with_experts = [int(name.split(".")[0]) - first for name, module in model.named_modules()
                    if isinstance(module, MoEMLP)]  # fmt: skip
    assert with_experts == [i for i in range(12) if i % interval == 0]
    assert [is_moe_layer(args, i) for i in range(12)] == [i % interval == 0 for i in range(12)]


def test_moe_layers_count_their_parameters():
    args = moe_args(num_layers=5)
    model = build_gpt(args)
    assert len(moe_layers(model)) == 3  # layers 0, 2, 4 at moe_expert_interval 2
    assert count_model_parameters(model) == count_parameters(args)


@pytest.mark.parametrize("overrides", [{}, {"activation": "swiglu"}, {"moe_glu": True}])
def test_active_parameters_and_flops_count_k_experts_and_the_router(overrides):
    args = moe_args(**overrides)
    model = build_gpt(args)
    total = count_model_parameters(model)
    one_expert = sum(p[0].numel() for p in moe_layers(model)[0].experts.parameters())
    assert active_parameters(args) == total - 2 * (E - K) * one_expert  # 2 MoE layers of 4
    tokens = torch.randint(0, 128, (1, SEQ))
    positions = torch.arange(SEQ)[None]
    with flop_counter() as counter:
        model.loss_fn(model(tokens, positions), (tokens, torch.ones(1, SEQ))).backward()
    counted = counter.get_total_flops() / SEQ
    assert training_flops_per_token(ModelShape.from_args(args)) == pytest.approx(counted, rel=1e-6)


def test_hugging_face_export_of_experts_is_refused():
    from megatron.model.hf_config import hf_config

    with pytest.raises(ValueError, match="moe_num_experts=4"):
        hf_config(moe_args(), "gpt_neox")


@pytest.mark.parametrize(
    "override, needle",
    [
        ("moe_type=deepspeed", "moe_type 'deepspeed'"),
        ("moe_top_k=9", "moe_top_k 9"),
        ("enable_expert_tensor_parallelism=true", "enable_expert_tensor_parallelism"),
        ("moe_expert_parallel_size=3", "moe_expert_parallel_size 3"),
        ("sequence_parallel=true", "sequence_parallel"),
    ],
)
def test_unbuilt_moe_values_are_refused_before_launch(override, needle):
    from megatron.config import load_config
    from megatron.config.schema import ConfigError

    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(["moe-small"], [override], world_size=2, vocab_size=512)


EP2 = "moe_expert_parallel_size=2"


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (['zero_optimization={"stage": 3}', "pipe_parallel_size=0"], "stage 3 is not built"),
        (
            ['zero_optimization={"stage": 1, "reduce_scatter": false}'],
            "zero_optimization.reduce_scatter false is not built",
        ),
        (
            [
                'zero_optimization={"stage": 2, "contiguous_gradients": false}',
                "pipe_parallel_size=0",
            ],
            "zero_optimization.contiguous_gradients false is not built",
        ),
        (["precision=bf16"], "with bf16 on the pipeline engine is not built"),
        (['optimizer={"type": "OneBitAdam", "params": {"lr": 0.001}}'], "type OneBitAdam"),
    ],
)
def test_expert_parallel_refuses_what_it_does_not_support(overrides, needle):
    from megatron.config import load_config
    from megatron.config.schema import ConfigError

    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(["moe-small"], [EP2, *overrides], world_size=2, vocab_size=512)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["pipe_parallel_size=0", "precision=bf16"],
        ['zero_optimization={"stage": 1}'],
        ['zero_optimization={"stage": 2}', "pipe_parallel_size=0", "precision=bf16"],
    ],
)
def test_expert_parallel_is_accepted_without_zero_and_with_zero_1_2(overrides):
    from megatron.config import load_config

    cfg = load_config(["moe-small"], [EP2, *overrides], world_size=4, vocab_size=512)
    assert cfg.moe.moe_expert_parallel_size == 2


def test_a_checkpoint_of_another_expert_parallel_size_is_refused_naming_reshard(tmp_path):
    import json

    from megatron.checkpoint.experts import check_expert_layout

    (tmp_path / "config.json").write_text(json.dumps({"moe_expert_parallel_size": 2}))
    check_expert_layout(tmp_path, 2)
    with pytest.raises(ValueError, match=r"moe_expert_parallel_size: 2.*--expert-parallel-size 1"):
        check_expert_layout(tmp_path, 1)
    (tmp_path / "config.json").write_text(json.dumps({"moe_num_experts": 4}))
    with pytest.raises(ValueError, match="saved with moe_expert_parallel_size 1"):
        check_expert_layout(tmp_path, 4)
