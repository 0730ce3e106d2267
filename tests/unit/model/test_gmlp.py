"""gMLP and aMLP layers against "Pay Attention to MLPs" (Liu et al. 2021), written out here
position by position, with GPT-NeoX's sizes (each channel half 4 h wide, the tiny attention
reading the activated projection), and GPT-NeoX's gmlp_small.yml resolving and training."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from megatron.config import ConfigError, load_config
from megatron.model import ModelArgs, build_gpt
from megatron.model.gmlp import GMLPTransformerLayer
from tests.unit.model.tiny import micro_batches, neox_args

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "configs"


def _layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _paper_block(layer, x, args):
    """The paper's gMLP block for one sequence `x (n, h)`, from the layer's weights:
    Z = gelu(LN(X) U); Z1, Z2 = split(Z); f = W LN(Z2) + b with W causal;
    [aMLP: f += tiny_attn(Z)]; Y = X + (Z1 * f) V."""
    eps = args.layernorm_epsilon
    n = x.shape[0]
    z = _layer_norm(x, layer.norm.weight, layer.norm.bias, eps) @ layer.input_linear.weight.T
    z = 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))  # exact GeLU
    ff = z.shape[1] // 2
    z1, z2 = z[:, :ff], z[:, ff:]
    sgu = layer.sgu
    z2 = _layer_norm(z2, sgu.norm.weight, sgu.norm.bias, eps)
    w, b = sgu.spatial_weight, sgu.spatial_bias
    gate = torch.stack(
        [sum(w[i, j] * z2[j] for j in range(i + 1)) + b[i] for i in range(n)]
    )  # row i mixes positions j <= i only
    if sgu.attn is not None:
        d = args.gmlp_attn_dim
        qkv = z @ sgu.attn.proj_qkv.weight.T + sgu.attn.proj_qkv.bias
        q, k, v = qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :]
        rows = []
        for i in range(n):
            scores = torch.stack([q[i] @ k[j] for j in range(i + 1)]) / math.sqrt(d)
            a = torch.softmax(scores, dim=0)
            rows.append(sum(a[j] * v[j] for j in range(i + 1)))
        attn = torch.stack(rows) @ sgu.attn.proj_ffn.weight.T + sgu.attn.proj_ffn.bias
        gate = gate + attn
    return x + (z1 * gate) @ layer.output_linear.weight.T


@pytest.mark.parametrize("kind", ["gmlp", "amlp"])
def test_block_is_the_papers_formula(kind):
    torch.manual_seed(0)
    args = ModelArgs(
        num_layers=1,
        hidden_size=8,
        num_attention_heads=2,
        vocab_size=16,
        seq_length=6,
        norm="layernorm",
        activation="gelu",
        layer_attention_types=(kind,),
        gmlp_attn_dim=4,
    )
    layer = GMLPTransformerLayer(args, 0).double()
    with torch.no_grad():  # trained-looking weights: the initial W = 0, b = 1 hides the mixing
        for p in layer.parameters():
            p.normal_(0.0, 0.5)
    x = torch.randn(5, 3, 8, dtype=torch.float64)  # (s, b, h), s < seq_length
    out, _ = layer((x, None))
    for b in range(3):
        torch.testing.assert_close(out[:, b], _paper_block(layer, x[:, b], args))


def test_new_block_is_a_plain_mlp_of_the_papers_initialisation():
    layer = GMLPTransformerLayer(neox_args(layer_attention_types=("gmlp",) * 4), 0)
    assert not layer.sgu.spatial_weight.any() and (layer.sgu.spatial_bias == 1).all()
    # GPT-NeoX's projections hold biases its forward never adds: built without them
    assert layer.input_linear.bias is None and layer.output_linear.bias is None
    x = torch.randn(17, 1, 32)  # one position more than seq_length
    with pytest.raises(ValueError, match="at most seq_length 16"):
        layer((x, None))


def _gmlp_small(world_size=1, **overrides):
    """GPT-NeoX's gmlp_small.yml with `--set KEY=VALUE` overrides, as deepy.py takes them."""
    sets = [f"{k}={v}" for k, v in overrides.items()]
    path = FIXTURES / "gmlp_small-neox.yml"
    return load_config([path], sets, world_size=world_size, vocab_size=128, warn=[])


def test_gpt_neox_gmlp_small_resolves_and_trains():
    cpu = dict(num_layers=2, hidden_size=16, seq_length=16, max_position_embeddings=16)
    # pipe_parallel_size 0: the plain model, built without a process group
    cfg = _gmlp_small(
        **cpu, num_attention_heads=2, pipe_parallel_size=0, **{"fp16.enabled": "false"}
    )
    assert cfg.model.layer_attention_types == ("gmlp", "gmlp")
    assert (cfg.model.gmlp_attn_dim, cfg.model.pos_emb) == (64, "none")
    args = ModelArgs.from_config(cfg)
    model = build_gpt(args).train()
    batches = micro_batches(args, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        for inputs, labels in batches:
            loss = model.loss_fn(model(*inputs), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model_parallel_size": 2}, "model_parallel_size 2.*different function"),
        ({"activation": "swiglu"}, "swiglu.*gated"),
        ({"moe_num_experts": 2}, "moe_num_experts 2.*no MLP"),
        ({"attention_config": '[[["amlp"], "all"]]', "gmlp_attn_dim": 0}, "gmlp_attn_dim"),
    ],
)
def test_what_gmlp_cannot_do_is_refused_before_launch(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _gmlp_small(world_size=2, **overrides)
