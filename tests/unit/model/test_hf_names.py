"""The Hugging Face rename table covers every parameter, and the QKV fusion is invertible."""

from __future__ import annotations

import math

import pytest
import torch

from megatron.model import build_gpt, from_hf, full_state_dict, fuse_qkv, name_map, split_qkv, to_hf
from megatron.model.init_methods import build_init_method
from tests.unit.model.tiny import llama_args, neox_args


@pytest.mark.parametrize(
    "args, arch",
    [
        (neox_args(no_weight_tying=True), "gpt_neox"),
        (neox_args(), "gpt_neox"),
        (llama_args(), "llama"),
        (llama_args(use_bias_in_attn_linear=True, use_bias_in_mlp=True), "llama"),
    ],
)
def test_every_parameter_has_a_hf_name_and_round_trips(args, arch):
    ours = full_state_dict(build_gpt(args))
    assert set(ours) <= set(name_map(args, arch)), set(ours) - set(name_map(args, arch))
    hf = to_hf(ours, args, arch)
    back = from_hf(hf, args, arch)
    assert back.keys() == ours.keys()
    for name, tensor in ours.items():
        assert torch.equal(back[name], tensor), name


def test_llama_qkv_layout_groups_queries_with_their_key_value_head():
    args = llama_args()  # 4 query heads, 2 kv heads, head dim 8
    d = args.head_dim

    def heads(first, count):  # rows of head h hold the value first + h
        return (first + torch.arange(count).repeat_interleave(d)).float()[:, None].repeat(1, 3)

    q, k, v = heads(0, 4), heads(10, 2), heads(20, 2)
    fused = fuse_qkv(q, k, v, args)  # rows: q0 q1 k0 v0 | q2 q3 k1 v1 (head blocks of d rows)
    assert fused[::d, 0].tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    for got, want in zip(split_qkv(fused, args), (q, k, v)):
        assert torch.equal(got, want)
    bias = torch.randn(8 * d)
    assert torch.equal(fuse_qkv(*split_qkv(bias, args), args), bias)


def test_vocabulary_padding_and_legacy_head_name():
    args = neox_args(no_weight_tying=True)  # 128 padded rows
    hf = to_hf(full_state_dict(build_gpt(args)), args, "gpt_neox", vocab_size=100)
    assert hf["gpt_neox.embed_in.weight"].shape[0] == 100 and "lm_head.weight" in hf
    hf["embed_out.weight"] = hf.pop("lm_head.weight")  # Pythia's checkpoint name
    ours = from_hf(hf, args, "gpt_neox")
    head = ours[f"{args.num_layers + 4}.final_linear.weight"]  # GPT-NeoX's head index
    assert head.shape[0] == 128 and not head[100:].any()


def test_init_methods_use_gpt_neox_standard_deviations():
    args = neox_args(num_layers=8, hidden_size=256, init_method_std=0.02)
    expected = {
        "normal": 0.02,
        "scaled_normal": 0.02 / math.sqrt(16),
        "small_init": math.sqrt(2 / (5 * 256)),
        "wang_init": 2 / 8 / math.sqrt(256),
    }
    torch.manual_seed(0)
    for name, std in expected.items():
        weight = torch.empty(512, 512)
        build_init_method(name, args)(weight)
        assert abs(weight.std().item() / std - 1) < 0.02, name
