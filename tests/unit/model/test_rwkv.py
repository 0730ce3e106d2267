"""RWKV-6 layers against GPT-NeoX's code, read as it is.

The references below transcribe GPT-NeoX's `megatron/model/rwkv/v6`: its CUDA kernel's
per-thread loop over tokens, `RWKV_TimeMix` / `RWKV_ChannelMix` / `RWKVResidualLayer.forward`
with their own ops (`ZeroPad2d` time shift, `bmm` LoRA, GroupNorm over (B*T, C)) on the
(B, T, C) input they unpack, in float64, and its initial values with its per-channel loops:
nothing of `megatron/model/rwkv*.py` is used but the parameters it built. Where GPT-NeoX's
pipeline feeds that code (s, b, h), the test shows the batch-axis shift we depart from. Our
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


def neox_wkv_kernel(b, t, c, h, r, k, v, w, u):
    """GPT-NeoX's `wkv6_cuda.cu` forward as it runs: tensors flat in (B, T, C); block (b, h),
    thread i (a value channel) keeps state[j] over the head's key channels and walks its
    tokens, y = sum_j r_j (u_j k_j v_i + state_j), state_j = state_j exp(ew_j) + k_j v_i,
    with `ew = -exp(w)` from `WKV.forward`. Float64, one token at a time."""
    n = c // h
    r, k, v, u = r.reshape(-1), k.reshape(-1), v.reshape(-1), u.reshape(-1)
    ew = -torch.exp(w.reshape(-1))
    y = torch.zeros(b * t * c, dtype=torch.float64)
    for block in range(b * h):
        bi, hi = block // h, block % h
        uh = u[hi * n : (hi + 1) * n]
        for i in range(n):
            state = torch.zeros(n, dtype=torch.float64)
            for pos in range(bi * t * c + hi * n + i, (bi + 1) * t * c + hi * n + i, c):
                head = slice(pos - i, pos - i + n)
                x = k[head] * v[pos]
                y[pos] = (r[head] * (uh * x + state)).sum()
                state = state * torch.exp(ew[head]) + x
    return y.view(b, t, c)


def neox_layer(p, x, layer_number):
    """GPT-NeoX's `RWKVResidualLayer.forward(x)` (`megatron/model/rwkv/v6/rwkv.py`) read as it
    is, on `x` of the shape it unpacks, (B, T, C): `time_shift = nn.ZeroPad2d((0, 0, 1, -1))`
    over dim -2, the 5-way LoRA through `bmm`, `RUN_CUDA_RWKV` (`neox_wkv_kernel`) and
    `ln_x` as a GroupNorm over (B*T, C), from the parameters `p` (our names are its names)."""
    b, t, c = x.size()
    heads = p["att.time_faaaa"].shape[0]
    shift = torch.nn.ZeroPad2d((0, 0, 1, -1))

    def ln(z, name):
        return torch.nn.functional.layer_norm(z, (c,), p[f"{name}.weight"], p[f"{name}.bias"])

    def linear(z, name):
        return z @ p[f"{name}.weight"].T

    def time_mix(x):
        xx = shift(x) - x
        xxx = x + xx * p["att.time_maa_x"]
        xxx = torch.tanh(xxx @ p["att.time_maa_w1"]).view(b * t, 5, -1).transpose(0, 1)
        xxx = torch.bmm(xxx, p["att.time_maa_w2"]).view(5, b, t, -1)
        mw, mk, mv, mr, mg = xxx.unbind(dim=0)
        xw = x + xx * (p["att.time_maa_w"] + mw)
        xk = x + xx * (p["att.time_maa_k"] + mk)
        xv = x + xx * (p["att.time_maa_v"] + mv)
        xr = x + xx * (p["att.time_maa_r"] + mr)
        xg = x + xx * (p["att.time_maa_g"] + mg)
        r, k, v = linear(xr, "att.receptance"), linear(xk, "att.key"), linear(xv, "att.value")
        g = torch.nn.functional.silu(linear(xg, "att.gate"))
        w = p["att.time_decay"] + torch.tanh(xw @ p["att.time_decay_w1"]) @ p["att.time_decay_w2"]
        y = neox_wkv_kernel(b, t, c, heads, r, k, v, w, p["att.time_faaaa"])
        y = torch.nn.functional.group_norm(
            y.view(b * t, c), heads, p["att.ln_x.weight"], p["att.ln_x.bias"], 1e-5 * 8**2
        )
        return linear(y.view(b, t, c) * g, "att.output")

    def channel_mix(x):
        xx = shift(x) - x
        key = torch.relu(linear(x + xx * p["ffn.time_maa_k"], "ffn.key")) ** 2
        gate = torch.sigmoid(linear(x + xx * p["ffn.time_maa_r"], "ffn.receptance"))
        return gate * linear(key, "ffn.value")

    if layer_number == 0:
        x = ln(x, "ln1")
    x = x + time_mix(ln(x, "ln1"))
    return x + channel_mix(ln(x, "ln2"))


def neox_parameters(layer):
    return {name: t.detach().double() for name, t in layer.named_parameters()}


def _trained_looking(layer):
    """Perturb every parameter so that no term hides behind a near-zero initial value."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in layer.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=gen))
    return layer


def _layer_and_input(index, b=2, t=19):
    args = neox_args(num_layers=3, layer_attention_types=("rwkv",) * 3, intermediate_size=64)
    torch.manual_seed(0)
    layer = _trained_looking(RWKVTransformerLayer(args, index)).double()
    x = torch.randn(b, t, args.hidden_size, generator=torch.Generator().manual_seed(3))
    return layer, x.double()


def ours(layer, x_sbh):
    """Our layer on the (s, b, h) hidden states the pipeline carries."""
    positions = torch.arange(x_sbh.shape[0]).expand(x_sbh.shape[1], -1)
    return layer((x_sbh, positions))[0]


@pytest.mark.parametrize("index", [0, 2])
def test_layer_equals_neox_code_over_the_time_axis(index):
    # GPT-NeoX's layer on (B, T, C), as its forward unpacks it; ours on the same tokens (T, B, C)
    layer, x = _layer_and_input(index)
    expected = neox_layer(neox_parameters(layer), x, index)
    torch.testing.assert_close(ours(layer, x.transpose(0, 1)).transpose(0, 1), expected)


def test_neox_pipeline_shifts_over_the_batch_axis():
    """The departure docs/gpt-neox.md lists: GPT-NeoX's `_pre_transformer_block` hands its layers
    (s, b, h) and `RWKVResidualLayerPipe` passes that to a forward reading (B, T, C), so its
    token shift mixes sample i with sample i-1 at one position. Ours shifts over time."""
    layer, x = _layer_and_input(1)
    x_sbh = x.transpose(0, 1).contiguous()
    neox_in_its_pipeline = neox_layer(neox_parameters(layer), x_sbh, 1)
    assert not torch.allclose(ours(layer, x_sbh), neox_in_its_pipeline, rtol=1e-3, atol=1e-3)
    # what it computes is ours with the batch taken for time and the positions for samples
    batch_for_time = ours(layer, x).transpose(0, 1)
    torch.testing.assert_close(neox_in_its_pipeline, batch_for_time)


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
