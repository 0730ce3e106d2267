"""RWKV-6 layers against GPT-NeoX's definition written out here, one token at a time.

The references below are written from GPT-NeoX's `megatron/model/rwkv/v6` (its CUDA kernel's
per-token loop and its `RWKV_TimeMix` / `RWKV_ChannelMix` / `RWKVResidualLayer` formulas), in
float64, one token after the other with an explicit per-head state and Python loops over the
initial values: nothing of `megatron/model/rwkv*.py` is used but the parameters it built. Our
layers compute in chunks (`megatron/model/rwkv_wkv.py`); run token by token from their own
state they must give the same as run whole.
"""

from __future__ import annotations

import math

import pytest
import torch

from megatron.model import build_gpt
from megatron.model.counting import count_parameters
from megatron.model.rwkv import RWKVTransformerLayer
from megatron.model.rwkv_wkv import wkv6
from tests.unit.model.tiny import micro_batches, neox_args


def recurrence(r, k, v, w, u, state=None):
    """The WKV kernel's loop: per batch, head and token, y_j = sum_i r_i (u_i k_i v_j + S_ij),
    then S_ij = exp(w_i) S_ij + k_i v_j. Shapes as `wkv6`'s; float64."""
    b, t, h, n = r.shape
    r, k, v, w, u = (x.double() for x in (r, k, v, w, u))
    ys, finals = [], []
    for bi in range(b):
        for hi in range(h):
            s = torch.zeros(n, n, dtype=torch.float64) if state is None else state[bi, hi].double()
            for ti in range(t):
                kv = torch.outer(k[bi, ti, hi], v[bi, ti, hi])
                ys.append(r[bi, ti, hi] @ (u[hi][:, None] * kv + s))
                s = torch.exp(w[bi, ti, hi])[:, None] * s + kv
            finals.append(s)
    y = torch.stack(ys).view(b, h, t, n).transpose(1, 2)
    return y, torch.stack(finals).view(b, h, n, n)


def random_inputs(b=2, t=37, h=2, n=4, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    r, k, v = (torch.randn(b, t, h, n, generator=gen) for _ in range(3))
    # log-decays from barely decaying to exp(-20) per token: strong decays must not overflow
    w = -torch.exp(torch.empty(b, t, h, n).uniform_(-5, 3, generator=gen))
    u = torch.randn(h, n, generator=gen)
    tensors = [r, k, v, w, u]
    for x in tensors:
        x.requires_grad_(requires_grad)
    return tensors


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_chunked_wkv_equals_the_recurrence_from_any_state(chunk):
    r, k, v, w, u = random_inputs()
    state = torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    for start in (None, state):
        y, final = wkv6(r, k, v, w, u, start, chunk=chunk)
        y_ref, final_ref = recurrence(r, k, v, w, u, start)
        torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(final.double(), final_ref, rtol=1e-5, atol=1e-4)


def test_chunked_wkv_gradients_equal_the_recurrence():
    # float64 (the chunks compute in the inputs' dtype when wider than fp32): equal to rounding
    ours = [x.double().requires_grad_() for x in random_inputs(t=21)]
    ref = [x.detach().clone().requires_grad_() for x in ours]
    weights = torch.randn(2, 21, 2, 4, generator=torch.Generator().manual_seed(2)).double()
    (wkv6(*ours, chunk=8)[0] * weights).sum().backward()
    (recurrence(*ref)[0] * weights).sum().backward()
    for name, a, b in zip("rkvwu", ours, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-10, msg=name)


def neox_initial_values(args, layer):
    """GPT-NeoX's initial time-mix/decay/bonus values, with its per-channel loops."""
    h, a, n_layers = args.hidden_size, args.hidden_size, args.num_layers
    ratio_0_to_1 = layer / (n_layers - 1)
    ratio_1_to_almost0 = 1.0 - layer / n_layers
    ddd = [i / h for i in range(h)]
    maa = [1.0 - d**ratio_1_to_almost0 for d in ddd]
    values = {
        "time_maa_x": maa,
        "time_maa_k": maa,
        "time_maa_v": [1.0 - (d**ratio_1_to_almost0 + 0.3 * ratio_0_to_1) for d in ddd],
        "time_maa_r": [1.0 - d ** (0.5 * ratio_1_to_almost0) for d in ddd],
        "time_decay": [-6 + 5 * (n / (a - 1)) ** (0.7 + 1.3 * ratio_0_to_1) for n in range(a)],
        "time_faaaa": [
            ratio_0_to_1 * (1 - n / (a - 1)) + ((n + 1) % 3 - 1) * 0.1 for n in range(a)
        ],
    }
    return values


def test_initial_values_are_neox_formulas():
    args = neox_args(num_layers=3, layer_attention_types=("rwkv",) * 3)
    for index in range(3):
        layer = RWKVTransformerLayer(args, index)
        for name, expected in neox_initial_values(args, index).items():
            got = getattr(layer.att, name).detach().flatten()
            torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32))
        torch.testing.assert_close(layer.ffn.time_maa_k, layer.att.time_maa_k)


def reference_layer(layer, x):
    """GPT-NeoX's `RWKVResidualLayer.forward` one token at a time, float64, from `layer`'s
    parameters; `x (B, T, C)`."""
    p = {name: t.detach().double() for name, t in layer.named_parameters()}
    b, t, c = x.shape
    x = x.double()
    heads, size = p["att.time_faaaa"].shape

    def layer_norm(z, name):
        return torch.nn.functional.layer_norm(z, (c,), p[f"{name}.weight"], p[f"{name}.bias"])

    if layer.layer_index == 0:
        x = layer_norm(x, "ln1")
    prev_att = torch.zeros(b, c, dtype=torch.float64)
    prev_ffn = torch.zeros(b, c, dtype=torch.float64)
    state = torch.zeros(b, heads, size, size, dtype=torch.float64)
    out = []
    for ti in range(t):
        xt = x[:, ti]
        a_in = layer_norm(xt, "ln1")
        xx = prev_att - a_in
        prev_att = a_in
        lora = torch.tanh((a_in + xx * p["att.time_maa_x"][0, 0]) @ p["att.time_maa_w1"])
        mixes = [lora[:, 32 * j : 32 * (j + 1)] @ p["att.time_maa_w2"][j] for j in range(5)]
        mixed = {}
        for j, name in enumerate("wkvrg"):
            mixed[name] = a_in + xx * (p[f"att.time_maa_{name}"][0, 0] + mixes[j])
        r = (mixed["r"] @ p["att.receptance.weight"].T).view(b, heads, size)
        k = (mixed["k"] @ p["att.key.weight"].T).view(b, heads, size)
        v = (mixed["v"] @ p["att.value.weight"].T).view(b, heads, size)
        g = torch.nn.functional.silu(mixed["g"] @ p["att.gate.weight"].T)
        decay = torch.tanh(mixed["w"] @ p["att.time_decay_w1"]) @ p["att.time_decay_w2"]
        w = torch.exp(-torch.exp(p["att.time_decay"][0, 0] + decay)).view(b, heads, size)
        y = torch.zeros(b, heads, size, dtype=torch.float64)
        for bi in range(b):
            for hi in range(heads):
                kv = torch.outer(k[bi, hi], v[bi, hi])
                bonus = p["att.time_faaaa"][hi][:, None] * kv
                y[bi, hi] = r[bi, hi] @ (bonus + state[bi, hi])
                state[bi, hi] = w[bi, hi][:, None] * state[bi, hi] + kv
        y = torch.nn.functional.group_norm(
            y.reshape(b, heads * size), heads, p["att.ln_x.weight"], p["att.ln_x.bias"], 64e-5
        )
        xt = xt + (y * g) @ p["att.output.weight"].T
        f_in = layer_norm(xt, "ln2")
        xx = prev_ffn - f_in
        prev_ffn = f_in
        key = torch.relu((f_in + xx * p["ffn.time_maa_k"][0, 0]) @ p["ffn.key.weight"].T) ** 2
        gate = torch.sigmoid((f_in + xx * p["ffn.time_maa_r"][0, 0]) @ p["ffn.receptance.weight"].T)
        out.append(xt + gate * (key @ p["ffn.value.weight"].T))
    return torch.stack(out, dim=1)


def _trained_looking(layer):
    """Perturb every parameter so that no term hides behind a near-zero initial value."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in layer.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=gen))
    return layer


@pytest.mark.parametrize("index", [0, 2])
def test_layer_equals_neox_definition_token_by_token(index):
    args = neox_args(num_layers=3, layer_attention_types=("rwkv",) * 3, intermediate_size=64)
    torch.manual_seed(0)
    layer = _trained_looking(RWKVTransformerLayer(args, index)).double()
    x = torch.randn(2, 19, args.hidden_size, generator=torch.Generator().manual_seed(3))
    hidden, _ = layer((x.double().transpose(0, 1), torch.arange(19).expand(2, 19)))
    reference = reference_layer(layer, x)
    torch.testing.assert_close(hidden.transpose(0, 1), reference, rtol=1e-9, atol=1e-9)


def test_state_form_equals_the_whole_sequence():
    args = neox_args(num_layers=2, layer_attention_types=("rwkv", "rwkv"))
    torch.manual_seed(0)  # float64: the chunked and the token-by-token sums agree to rounding
    layer = _trained_looking(RWKVTransformerLayer(args, 1)).double()
    x = torch.randn(2, 23, args.hidden_size, generator=torch.Generator().manual_seed(4)).double()
    whole, final = layer.forward_with_state(x)
    for pieces in ([1] * 23, [7, 16], [20, 3]):
        outputs, state, start = [], None, 0
        for size in pieces:
            out, state = layer.forward_with_state(x[:, start : start + size], state)
            outputs.append(out)
            start += size
        torch.testing.assert_close(torch.cat(outputs, dim=1), whole, rtol=1e-10, atol=1e-10)
        for a, b in zip(state, final, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_mixed_model_counts_and_trains():
    types = ("rwkv", "global", "rwkv", "sdpa")
    args = neox_args(layer_attention_types=types, dim_att=64, num_attention_heads=4, ffn_dim=40)
    model = build_gpt(args)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(args)
    att = model.get_submodule("2.att")
    assert att.key.weight.shape == (64, 32) and att.time_faaaa.shape == (4, 16)
    assert model.get_submodule("2.ffn").key.weight.shape == (40, 32)
    ((inputs, labels),) = micro_batches(args, 1)
    loss = model.loss_fn(model(*inputs), labels)
    assert math.isfinite(loss.item())


@pytest.mark.parametrize(
    "overrides, width",
    [({}, 96), ({"intermediate_size": 100}, 96), ({"ffn_dim": 50}, 50)],
)
def test_ffn_dim_follows_neox_rule(overrides, width):
    # GPT-NeoX: intermediate_size, else int(3.5 × hidden), then floor to a multiple of 32.
    args = neox_args(num_layers=1, layer_attention_types=("rwkv",), **overrides)
    assert RWKVTransformerLayer(args, 0).ffn.key.out_features == width
