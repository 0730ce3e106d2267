"""FLOPs per token against torch's FLOP counter on Hugging Face models; MFU arithmetic."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from megatron.training.flops import (
    ModelShape,
    default_intermediate_size,
    forward_flops_per_token,
    peak_tflops,
    shape_from_config,
    throughput,
    training_flops_per_token,
)

SEQ = 32


def _counted(model, backward=False) -> float:
    x = torch.randint(0, 128, (1, SEQ))
    with FlopCounterMode(display=False) as counter:
        out = model(x).logits
        if backward:
            out.sum().backward()
    return counter.get_total_flops() / SEQ


def test_matches_flop_counter_on_gpt_neox():
    cfg = transformers.GPTNeoXConfig(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=SEQ,
        attn_implementation="eager",
    )
    model = transformers.GPTNeoXForCausalLM(cfg)
    shape = ModelShape(2, 64, 4, SEQ, 128, 256)
    assert forward_flops_per_token(shape) == _counted(model)
    assert training_flops_per_token(shape) == _counted(model, backward=True)


def test_matches_flop_counter_on_gated_gqa_llama():
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=96,
        max_position_embeddings=SEQ,
        attn_implementation="eager",
    )
    model = transformers.LlamaForCausalLM(cfg)
    shape = ModelShape(2, 64, 8, SEQ, 128, 96, num_kv_heads=2, gated_mlp=True)
    assert forward_flops_per_token(shape) == _counted(model)


def test_hand_count_is_6n_plus_attention():
    h, f, v, layers = 64, 256, 128, 2
    n_matmul = layers * (4 * h * h + 2 * h * f) + h * v
    expected = 6 * n_matmul + 12 * layers * SEQ * h
    assert training_flops_per_token(ModelShape(layers, h, 4, SEQ, v, f)) == expected


def test_shape_from_config_defaults_the_mlp(make_config):
    shape = shape_from_config(make_config())
    assert (shape.intermediate_size, shape.vocab_size, shape.gated_mlp) == (256, 128, False)
    shape = shape_from_config(make_config(activation="swiglu", mlp_multiple_of=32))
    assert (shape.intermediate_size, shape.gated_mlp) == (192, True)  # 2/3 · 256 → 170 → 192
    assert default_intermediate_size(64, "gelu") == 256


def test_peak_and_mfu():
    assert peak_tflops("bf16", device_name="NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("bf16", device_name="NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("fp16", device_name="NVIDIA A100-SXM4-40GB") == 312.0
    assert peak_tflops("bf16", device_name="Some Future Accelerator") is None
    assert peak_tflops("bf16", override=100.0, device_name="cpu") == 100.0
    t = throughput(tokens=4000, seconds=2.0, flops_per_token=1e9, world_size=2, peak=10.0)
    assert t.tokens_per_sec == 2000.0
    assert t.tflops_per_gpu == pytest.approx(1.0)
    assert t.mfu == pytest.approx(0.1)
    assert throughput(10, 1.0, 1e9, 1, None).mfu is None
