"""What a GPU would hold for each layer type beyond attention: no sequence × sequence buffer
unless the layer's math is one, and none with a vocabulary dimension.

Each layer (the MLP or MoE block alone, the Mamba, RWKV, gMLP and aMLP blocks whole) runs
one training forward in bf16 at micro batch 2 and sequence 2048 (Mamba 512: its reference
scan loops over the tokens in Python, and an (s, s) buffer would show at any length) with
`tests/device_costs.py::LargeTensors` recording each op's outputs and what autograd saves (the
attention audit's counter; attention itself is `test_attention_buffers.py`'s). The width is
scaled down as there (hidden 96): a sequence × sequence buffer depends on the sequence and the
heads, not on the width. The model's vocabulary (50304) is given to the layers' arguments
so that a buffer sized by it would show.

The (s, s) buffers a layer may hold, each because it is the layer's math:
- gMLP and aMLP: the causal spatial weight, `tril(W[:s, :s])`, one `(s, s)` matrix per layer
  (the parameter's own size; `F.linear` keeps it for the backward). Before the fix the layer
  also built a bool `(s, s)` mask each forward and kept it for `masked_fill`'s backward
  (4.2 MB).
- aMLP's tiny attention is one causal head, which SDPA's flash kernels compute without the
  `(b, 1, s, s)` scores: before the fix it built the scores, their scaled, masked and softmaxed
  copies (bf16, 16.8 MB each; twice with `attention_softmax_in_fp32`) and a bool causal mask,
  88 MB of (s, s)-sized memory per layer at this shape, where now there is the 8.4 MB weight.

Largest buffer per layer at this shape (b=2, s=2048, h=96, bf16 weights), for the record:
dense MLP's and MoE's are `(s, b, 4h)`-sized activations; Mamba's reference scan the fp32
`(b, 2h, s, 16)` decay and drive; RWKV's chunked WKV the fp32 `(b, H, s/16, 16, 16, K)`
pairwise exponent (16 times r's size, the chunk length, not the sequence); gMLP's the
`(b, s, 8h)` activation.
"""

from __future__ import annotations

import functools

import pytest
import torch

from megatron.model import ModelArgs
from megatron.model.moe import build_layer_mlp
from megatron.model.specs import BLOCK_LAYERS
from tests.device_costs import LargeTensors
from tests.unit.model.test_gmlp import _paper_block

B, S, HIDDEN, VOCAB = 2, 2048, 96, 50304
MAMBA_S = 512  # the reference scan's Python loop over tokens: ~30 s at 2048 on a loaded CPU
MOE = dict(moe_num_experts=8, moe_top_k=2, moe_router_type="topk", moe_expert_interval=1)
# name -> (the layer's keys, whether it is a block replacing the whole transformer layer)
LAYERS = {
    "mlp gelu": ({}, False),
    "mlp swiglu": ({"activation": "swiglu"}, False),
    "moe dropping": ({**MOE, "moe_token_dropping": True}, False),
    "moe dropless": ({**MOE, "moe_token_dropping": False}, False),
    "mamba": ({"layer_attention_types": ("mamba",), "norm": "rmsnorm"}, True),
    "rwkv": ({"layer_attention_types": ("rwkv",)}, True),
    "gmlp": ({"layer_attention_types": ("gmlp",)}, True),
    "amlp": ({"layer_attention_types": ("amlp",), "gmlp_attn_dim": 64}, True),
}
SPATIAL = ("gmlp", "amlp")


def seq_length(name: str) -> int:
    return MAMBA_S if name == "mamba" else S


def layer_args(**changes) -> ModelArgs:
    values = dict(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=12,
        vocab_size=VOCAB,
        seq_length=S,
        norm="layernorm",
        activation="gelu",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        seed=3,
    )
    return ModelArgs(**{**values, **changes})


@functools.cache  # both tests read one forward (the buffers hold no tensor, only weak refs)
def one_forward(name: str) -> LargeTensors:
    """`LargeTensors` of one training forward of the layer `name` (bf16)."""
    changes, block = LAYERS[name]
    s = seq_length(name)
    args = layer_args(seq_length=s, **changes)
    torch.manual_seed(0)
    if block:
        layer = BLOCK_LAYERS[args.attention_type(0)](args, 0)
    else:
        layer = build_layer_mlp(args, 0)
    layer = layer.to(torch.bfloat16).train()
    x = torch.randn(s, B, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    inputs = (x, torch.arange(s).expand(B, s)) if block else x
    with LargeTensors() as buffers:
        layer(inputs)
    return buffers


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_no_layer_holds_a_needless_sequence_by_sequence_buffer(name):
    buffers, s = one_forward(name), seq_length(name)
    square = buffers.square(s)
    if name in SPATIAL:  # the causal spatial weight, one matrix (module docstring)
        assert {b.shape for b in square} == {(s, s)}, buffers.report(square)
        assert len({b.storage for b in square}) == 1, buffers.report(square)
    else:
        assert not square, f"{name}: {buffers.report(square)}"


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_no_layer_holds_a_vocabulary_sized_buffer(name):
    buffers = one_forward(name)
    sized = [b for b in buffers.buffers if VOCAB in b.shape]
    assert not sized, f"{name}: {buffers.report(sized)}"


@pytest.mark.parametrize("kind", SPATIAL)
def test_gmlp_gradients_are_the_papers_formula(kind):
    """The causal weight by `tril` and the tiny attention by SDPA give the gradients of the
    paper's block written out position by position (`test_gmlp.py`'s), weights and input."""
    torch.manual_seed(0)
    args = layer_args(
        hidden_size=8,
        num_attention_heads=2,
        seq_length=6,
        layer_attention_types=(kind,),
        gmlp_attn_dim=4,
    )
    layer = BLOCK_LAYERS[kind](args, 0).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.5)
    x = torch.randn(5, 2, 8, dtype=torch.float64, requires_grad=True)
    up = torch.randn(5, 2, 8, dtype=torch.float64)
    grads = torch.autograd.grad((layer((x, None))[0] * up).sum(), [x, *layer.parameters()])
    paper = torch.stack([_paper_block(layer, x[:, b], args) for b in range(2)], dim=1)
    expected = torch.autograd.grad((paper * up).sum(), [x, *layer.parameters()])
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)
