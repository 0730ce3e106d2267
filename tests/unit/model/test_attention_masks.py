"""Score biases built once per forward give the numbers the per-layer ones gave.

- ALiBi's bias is `slope_h * (pos_k - pos_q)` where a key is visible (the formula written here,
  rounded once to the compute dtype) and the dtype's lowest value where it is blocked.
- Rotary's cos/sin are built once per forward too (counted: the same kernels at 2 and 4
  layers), with the same numbers.
- The per-forward cache follows the position ids: other ids (another micro-batch), or the same
  tensor changed in place, give the logits of a model that never cached anything; activation
  checkpointing (which recomputes with copies of the ids) gives the same loss and gradients
  (ALiBi, rotary: bitwise; rpe: within rounding, see the test).
- SDPA gets a mask with every query head's keys (the CUDA kernel that takes a mask takes no
  `enable_gqa`), and `enable_gqa` with `is_causal` where there is no mask (flash).
- `FusedSoftmaxAttention` in bf16 is the textbook formula within bf16's rounding.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from megatron.model import build_gpt
from megatron.model.attention_backends import FusedSoftmaxAttention, SDPAAttention
from megatron.model.attention_masks import clear_masks
from megatron.model.positional import AlibiBias, alibi_slopes
from tests.device_costs import HostOps
from tests.unit.model.tiny import assert_close, micro_batches, neox_args

S, B, NQ, NKV, D = 7, 2, 4, 2, 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 2])
def test_alibi_bias_is_the_formula_with_the_mask_in_it(dtype, window):
    args = neox_args(num_attention_heads=NQ, pos_emb="alibi", sliding_window_width=window)
    positions = torch.stack([torch.arange(S), torch.arange(S) % 3])  # a packed second row
    q = torch.zeros(S, B, NQ, D, dtype=dtype)
    clear_masks()
    _, _, bias = AlibiBias(args).encode(q, q, positions)
    assert bias.dtype == dtype and bias.shape == (B, NQ, S, S)
    slopes = torch.tensor(alibi_slopes(NQ)).view(1, NQ, 1, 1)
    expected = (slopes * (positions[:, None, None, :] - positions[:, None, :, None])).to(dtype)
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    blocked = (j > i) | ((i - j > window) if window is not None else False)
    expected = expected.masked_fill(blocked, torch.finfo(dtype).min)
    assert torch.equal(bias, expected)


def logits(model, tokens, positions):
    with torch.no_grad():
        return model(tokens, positions)


@pytest.mark.parametrize("pos_emb", ["alibi", "rpe", "rotary"])
def test_the_cache_follows_the_position_ids(pos_emb):
    args = neox_args(pos_emb=pos_emb, sliding_window_width=5)
    model = build_gpt(args).eval()
    tokens = torch.randint(0, args.vocab_size, (B, 16), generator=torch.Generator().manual_seed(2))
    packed = torch.stack([torch.arange(16), torch.arange(16) % 6])
    plain = torch.arange(16).expand(B, 16).contiguous()
    fresh = []
    for positions in (packed, plain):
        clear_masks()
        fresh.append(logits(model, tokens, positions))
    clear_masks()
    assert torch.equal(logits(model, tokens, packed), fresh[0])
    assert torch.equal(logits(model, tokens, plain), fresh[1])  # other ids: rebuilt
    changing = packed.clone()
    assert torch.equal(logits(model, tokens, changing), fresh[0])
    changing.copy_(plain)  # the same tensor, changed in place: rebuilt
    assert torch.equal(logits(model, tokens, changing), fresh[1])
    assert not torch.equal(fresh[0], fresh[1])


def loss_and_grads(args, batch):
    model = build_gpt(args)
    inputs, labels = batch
    loss = model.loss_fn(model(*inputs), labels)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("pos_emb", ["alibi", "rpe", "rotary"])
def test_activation_checkpointing_rebuilds_the_same_bias(pos_emb):
    args = neox_args(pos_emb=pos_emb, sliding_window_width=6)
    (batch,) = micro_batches(args, 1)
    loss, grads = loss_and_grads(args, batch)
    ckpt = dataclasses.replace(args, checkpoint_activations=True, checkpoint_num_layers=1)
    ckpt_loss, ckpt_grads = loss_and_grads(ckpt, batch)
    assert_close(ckpt_loss, loss, "checkpointed loss", tol=1e-6)
    for name, grad in grads.items():
        if pos_emb != "rpe":
            assert torch.equal(ckpt_grads[name], grad), name
        else:
            # On the CPU, SDPA runs its flash kernel in checkpointing's no-grad forward and
            # the math kernel in the recompute (rpe's mask needs a gradient): rounding apart.
            # (On CUDA the memory-efficient kernel runs both.)
            assert_close(ckpt_grads[name], grad, name, tol=1e-5)


def test_rotary_angles_are_built_once_per_forward():
    """cos/sin of the rotary angles: the same kernels at 2 and 4 layers (14 more per layer when
    each layer built its own, a few hundred launches per step at 160M)."""
    built = []
    for layers in (2, 4):
        args = neox_args(pos_emb="rotary", num_layers=layers)
        (((tokens, positions), _),) = micro_batches(args, 1)
        model = build_gpt(args)
        clear_masks()
        with HostOps() as ops:
            model(tokens, positions)
        places = ("model/positional.py", "model/rope_scaling.py")
        built.append(sum(n for where, n in ops.where.items() if any(p in where for p in places)))
    assert built[0] == built[1] > 0, built


def sdpa_arguments(monkeypatch, args, bias=None):
    """The key heads, mask and flags SDPAAttention hands torch's SDPA."""
    seen = {}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.update(kwargs, q_heads=q.shape[1], k_heads=k.shape[1])
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v = (torch.randn(S, B, n, D) for n in (NQ, NKV, NKV))
    SDPAAttention(args, 1).eval()(q, k, v, bias)
    return seen


def test_a_mask_goes_to_sdpa_with_every_key_value_head(monkeypatch):
    gqa = dict(num_attention_heads=NQ, num_kv_heads=NKV, hidden_size=NQ * D)
    seen = sdpa_arguments(monkeypatch, neox_args(**gqa))
    assert seen["attn_mask"] is None and seen["is_causal"] and seen["enable_gqa"]
    assert seen["k_heads"] == NKV
    seen = sdpa_arguments(monkeypatch, neox_args(**gqa, sliding_window_width=2))
    assert seen["attn_mask"].shape == (S, S) and not seen["is_causal"]
    assert seen["k_heads"] == seen["q_heads"] == NQ and not seen["enable_gqa"]


def textbook(q, k, v):
    """softmax(q k^T / sqrt(d)) v, causal, in (s, b, n, d) with key/value heads repeated."""
    groups = q.shape[2] // k.shape[2]
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    future = torch.ones(S, S, dtype=torch.bool).triu(1)
    return (scores.masked_fill(future, float("-inf")).softmax(-1) @ v).permute(2, 0, 1, 3)


@pytest.mark.parametrize("scaled", [False, True])
def test_fused_global_attention_in_bf16_is_the_textbook_formula(scaled):
    args = neox_args(
        num_attention_heads=NQ,
        num_kv_heads=NKV,
        hidden_size=NQ * D,
        softmax_fusion=True,
        apply_query_key_layer_scaling=scaled,
        attention_softmax_in_fp32=scaled,
    )
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(S, B, n, D, generator=gen).bfloat16() for n in (NQ, NKV, NKV))
    expected = textbook(q.double(), k.double(), v.double())
    actual = FusedSoftmaxAttention(args, layer_number=3).eval()(q, k, v)
    assert actual.dtype == torch.bfloat16
    assert_close(actual.double(), expected, "bf16 fused global attention", tol=2e-2)
