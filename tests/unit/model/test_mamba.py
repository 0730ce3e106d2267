"""Mamba layers against Hugging Face `transformers.MambaForCausalLM` (fp32, CPU, 1e-5), a
mixed Mamba/attention model, and the CUDA kernels against the PyTorch reference (GPU only).

The Hugging Face model is built from the config `hf_config(args, "mamba")` gives, its weights
randomised (norms, A_log, D and the step-size bias included) and loaded into ours through the
rename table; both run the same tokens.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from megatron.model import ModelArgs, build_gpt, from_hf, hf_config, load_full_state_dict
from megatron.model.mamba_scan import causal_conv, selective_scan
from megatron.model.param_groups import param_groups

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, BATCH = 64, 10, 2


def mamba_args(**overrides) -> ModelArgs:
    keys = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=VOCAB,
        seq_length=SEQ,
        layer_attention_types=("mamba", "mamba"),
        norm="rmsnorm",
        rms_norm_epsilon=1.0e-5,
        use_bias_in_norms=False,
        pos_emb="none",
    )
    return ModelArgs(**{**keys, **overrides})


def hf_mamba(args: ModelArgs) -> torch.nn.Module:
    config = transformers.MambaConfig(**hf_config(args, "mamba"))
    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.3 * noise)
    return model


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"mamba_use_bias_in_conv": False, "intermediate_size": 96, "no_weight_tying": True},
    ],
    ids=["default", "no-conv-bias-expand3-untied"],
)
def test_mamba_model_equals_transformers_mamba(overrides):
    args = mamba_args(**overrides)
    hf = hf_mamba(args)
    ours = build_gpt(args).eval()
    load_full_state_dict(ours, from_hf(hf.state_dict(), args, "mamba"))
    ids = tokens()
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        actual = ours(ids, torch.arange(SEQ).expand(BATCH, SEQ))
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=1.0e-5, rtol=1.0e-5)


def test_mamba_state_and_decay_rules():
    args = mamba_args(layer_attention_types=("mamba", "global"))
    model = build_gpt(args)
    mixer = model.get_submodule("2.mixer")
    # S4D-real initialisation: A = -(1..16) on every channel, D = 1
    expected_a = -torch.arange(1, 17, dtype=torch.float32).expand(64, 16)
    torch.testing.assert_close(-torch.exp(mixer.A_log), expected_a)
    assert torch.equal(mixer.D, torch.ones(64))
    no_decay = {
        id(p) for g in param_groups(model, 0.1) if g["weight_decay"] == 0 for p in g["params"]
    }
    assert id(mixer.A_log) in no_decay and id(mixer.D) in no_decay
    assert id(mixer.in_proj.weight) not in no_decay


def test_mamba_layers_are_causal():
    model = build_gpt(mamba_args()).eval()
    ids = tokens()
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    positions = torch.arange(SEQ).expand(BATCH, SEQ)
    with torch.no_grad():
        a, b = model(ids, positions), model(changed, positions)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


KERNELS = importlib.util.find_spec("mamba_ssm") and importlib.util.find_spec("causal_conv1d")


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and KERNELS), reason="needs CUDA + mamba-ssm")
def test_kernels_equal_the_reference():
    gen = torch.Generator().manual_seed(0)
    b, d, n, s = 2, 64, 16, 33

    def rand(*shape):
        return torch.randn(*shape, generator=gen).cuda()

    u, delta, z = rand(b, d, s), rand(b, d, s), rand(b, d, s)
    A, B, C, D, bias = (
        -torch.rand(d, n, generator=gen).cuda(),
        rand(b, n, s),
        rand(b, n, s),
        rand(d),
        rand(d),
    )
    fused = selective_scan(u, delta, A, B, C, D, z, bias, fused=True)
    reference = selective_scan(u, delta, A, B, C, D, z, bias, fused=False)
    torch.testing.assert_close(fused, reference, atol=1e-4, rtol=1e-4)
    w, cb = rand(d, 1, 4), rand(d)
    torch.testing.assert_close(
        causal_conv(u, w, cb, fused=True), causal_conv(u, w, cb, fused=False), atol=1e-5, rtol=1e-5
    )
    args = mamba_args(mamba_inner_func_fusion=True)
    model = build_gpt(args).cuda()
    positions = torch.arange(SEQ).expand(BATCH, SEQ).cuda()
    with torch.no_grad():
        fused_logits = model(tokens().cuda(), positions)
        reference = build_gpt(dataclasses.replace(args, mamba_inner_func_fusion=False)).cuda()
        reference.load_state_dict(model.state_dict())
        torch.testing.assert_close(
            fused_logits, reference(tokens().cuda(), positions), atol=1e-4, rtol=1e-4
        )


def test_parameter_count_is_transformers_mamba_count():
    from megatron.model import count_parameters

    args = mamba_args(intermediate_size=96, mamba_use_bias_in_conv=False)
    hf = transformers.MambaForCausalLM(transformers.MambaConfig(**hf_config(args, "mamba")))
    assert count_parameters(args) == sum(p.numel() for p in hf.parameters())


def test_forward_flops_are_the_matmuls_torch_counts():
    # torch's FLOP counter over the built model: its `mm` ops are the four projections and the
    # head; the convolution and the scan's per-step products (bmm) are element-wise work the
    # model-FLOPs definition leaves out (megatron/training/metrics/flops.py).
    from megatron.training.metrics.flops import ModelShape, forward_flops_per_token
    from tests.flop_counter import flop_counter

    args = mamba_args(intermediate_size=96)
    model = build_gpt(args)
    with flop_counter() as counter, torch.no_grad():
        model(tokens(), torch.arange(SEQ).expand(BATCH, SEQ))
    counted = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert forward_flops_per_token(ModelShape.from_args(args)) * BATCH * SEQ == counted["aten.mm"]
