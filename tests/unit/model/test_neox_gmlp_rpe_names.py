"""gMLP and rpe layers save and load GPT-NeoX's tensor names, both ways.

GPT-NeoX's names, written out from its source (`megatron/model/gmlp.py`: `GMLPBlock` with
`norm`, `input_linear` and `output_linear` (column/row-parallel linears built with a bias its
forward discards, `skip_bias_add`), `sgu` = `SpatialGatingUnit` with `norm`, `proj`
(`nn.Linear(seq_length, seq_length)`) and, for aMLP, `attn` = `TinyAttention` with `proj_qkv`
and `proj_ffn`; `megatron/model/transformer.py`: the attention's shared T5 bias `rpe`, a
`ParallelRelativePositionBias` whose `weight` is `(num_buckets, heads)`), not from ours:
our layers' state dicts hold exactly those names and shapes, and a state under them loads
into our layers with its values (the discarded biases dropped), as do our names from before.
"""

from __future__ import annotations

import pytest
import torch

from megatron.model import ModelArgs
from megatron.model.gmlp import GMLPTransformerLayer
from megatron.model.transformer import TransformerLayer

H, S, HEADS, ATTN, BUCKETS = 16, 12, 4, 8, 6
FF = 4 * H  # GPT-NeoX's ff_mult


def neox_gmlp_names(amlp: bool) -> dict[str, tuple[int, ...]]:
    names = {
        "norm.weight": (H,), "norm.bias": (H,),
        "input_linear.weight": (2 * FF, H), "input_linear.bias": (2 * FF,),
        "sgu.norm.weight": (FF,), "sgu.norm.bias": (FF,),
        "sgu.proj.weight": (S, S), "sgu.proj.bias": (S,),
        "output_linear.weight": (H, FF), "output_linear.bias": (H,),
    }  # fmt: skip
    if amlp:
        names.update({
            "sgu.attn.proj_qkv.weight": (3 * ATTN, 2 * FF), "sgu.attn.proj_qkv.bias": (3 * ATTN,),
            "sgu.attn.proj_ffn.weight": (FF, ATTN), "sgu.attn.proj_ffn.bias": (FF,),
        })  # fmt: skip
    return names


def _gmlp(kind: str) -> GMLPTransformerLayer:
    args = ModelArgs(num_layers=1, hidden_size=H, num_attention_heads=HEADS, vocab_size=32,
                     seq_length=S, layer_attention_types=(kind,), gmlp_attn_dim=ATTN)  # fmt: skip
    return GMLPTransformerLayer(args, 0)


@pytest.mark.parametrize("kind", ["gmlp", "amlp"])
def test_a_gmlp_layer_saves_and_loads_gpt_neoxs_names(kind):
    torch.manual_seed(0)
    layer = _gmlp(kind)
    saved = layer.state_dict()
    expected = neox_gmlp_names(kind == "amlp")
    assert {k: tuple(v.shape) for k, v in saved.items()} == expected
    assert not saved["input_linear.bias"].any() and not saved["output_linear.bias"].any()
    neox = {k: torch.randn(shape) for k, shape in expected.items()}  # a file GPT-NeoX wrote
    other = _gmlp(kind)
    other.load_state_dict(neox)  # strict: every tensor has its place
    assert torch.equal(other.sgu.spatial_weight, neox["sgu.proj.weight"])
    assert torch.equal(other.sgu.spatial_bias, neox["sgu.proj.bias"])
    assert torch.equal(other.input_linear.weight, neox["input_linear.weight"])
    before = {"sgu.proj.weight": "sgu.spatial_weight", "sgu.proj.bias": "sgu.spatial_bias"}
    ours_before = {before.get(k, k): v for k, v in neox.items() if not k.endswith("linear.bias")}
    again = _gmlp(kind)
    again.load_state_dict(ours_before)
    assert torch.equal(again.sgu.spatial_weight, neox["sgu.proj.weight"])


def test_an_rpe_layer_saves_and_loads_gpt_neoxs_table():
    args = ModelArgs(num_layers=1, hidden_size=H, num_attention_heads=HEADS, vocab_size=32,
                     seq_length=S, pos_emb="rpe", rpe_num_buckets=BUCKETS,
                     rpe_max_distance=9)  # fmt: skip
    layer = TransformerLayer(args, 0)
    saved = layer.state_dict()
    assert tuple(saved["attention.rpe.weight"].shape) == (BUCKETS, HEADS)
    assert not any("positions" in k for k in saved)
    table = torch.randn(BUCKETS, HEADS)
    other = TransformerLayer(args, 0)
    other.load_state_dict({**saved, "attention.rpe.weight": table})
    assert torch.equal(other.attention.positions.weight, table)
    renamed = {k.replace("rpe", "positions"): v for k, v in saved.items()}  # ours from before
    other.load_state_dict(renamed)
    assert torch.equal(other.attention.positions.weight, saved["attention.rpe.weight"])
