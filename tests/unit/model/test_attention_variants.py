"""Attention variants of issue 13 against formulas written here, on CPU in fp32.

- Sliding window (`sliding_window_width` W: query i sees keys j with 0 <= i - j <= W): every
  backend (reference, fused softmax, SDPA; with grouped query heads and with ALiBi) equals a
  textbook masked attention, for W smaller and larger than the sequence, output and gradients;
  so does the key/value cache's attention (`CachedAttention`, what generation runs), fed a
  prefill, a two-token chunk and then one token at a time; a model generating with the cache
  gives, token by token, the logits of the full forward pass, and a window shorter than the
  sequence does change them (a longer one does not).
- z-loss: `loss_fn` equals cross entropy + z × masked mean of logsumexp², and at tp=2 (gloo,
  vocabulary split) the same value and logit gradients as at tp=1; with vocabulary padding,
  both terms over the token columns alone, the padding's gradient zero.
- q/k/v-only biases and an explicit head_dim: the parameters built are the ones counted.
- The config keys: accepted (no longer refused as planned), bad values refused by name.
"""

from __future__ import annotations

import math

import pytest
import torch

from megatron.config import ConfigError, config_from_dict
from megatron.inference.kv_cache import CachedAttention, KVCache, kv_cache
from megatron.model import build_gpt, layer_parameters, loss_fn
from megatron.model.attention_backends import (
    FusedSoftmaxAttention,
    ReferenceAttention,
    SDPAAttention,
)
from megatron.model.positional import AlibiBias
from tests.distributed import run_distributed
from tests.unit.model.tiny import assert_close, llama_args, neox_args

S, B, NQ, NKV, D = 9, 2, 4, 2, 8


def windowed_attention(q, k, v, window, bias=None):
    """softmax(q k^T / sqrt(d) + bias) v, key j visible to query i iff 0 <= i - j <= window."""
    groups = q.shape[2] // k.shape[2]
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    hidden = (j > i) | (i - j > window)
    probs = scores.masked_fill(hidden, float("-inf")).softmax(-1)
    return (probs @ v).permute(2, 0, 1, 3)


def run(fn):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(S, B, NQ, D, generator=gen, requires_grad=True)
    k = torch.randn(S, B, NKV, D, generator=gen, requires_grad=True)
    v = torch.randn(S, B, NKV, D, generator=gen, requires_grad=True)
    out = fn(q, k, v)
    out.backward(torch.ones_like(out).cumsum(0))
    return out.detach(), [t.grad for t in (q, k, v)]


@pytest.mark.parametrize("backend", [ReferenceAttention, FusedSoftmaxAttention, SDPAAttention])
@pytest.mark.parametrize("window", [0, 3, 20])
@pytest.mark.parametrize("alibi", [False, True])
def test_sliding_window_matches_masked_attention(backend, window, alibi):
    args = neox_args(
        num_attention_heads=NQ,
        num_kv_heads=NKV,
        hidden_size=NQ * D,
        sliding_window_width=window,
        pos_emb="alibi" if alibi else "rotary",
    )
    bias = None
    if alibi:
        q = torch.zeros(S, B, NQ, D)
        _, _, bias = AlibiBias(args).encode(q, q, torch.arange(S).expand(B, S))
    expected, expected_grads = run(lambda q, k, v: windowed_attention(q, k, v, window, bias))
    core = backend(args, layer_number=2).eval()
    actual, grads = run(lambda q, k, v: core(q, k, v, bias))
    assert_close(actual, expected, f"{backend.__name__} W={window}", tol=1e-6)
    for name, g, eg in zip("qkv", grads, expected_grads):
        # At W = 0 a query sees itself alone, so dq is exactly 0; SDPA's CPU kernel leaves
        # ~2e-6 of rounding there (AMD EPYC): the inputs' scale (order 1) is the floor.
        assert_close(g, eg, f"{backend.__name__} W={window} d{name}", tol=1e-5, floor=1.0)


@pytest.mark.parametrize("backend", [ReferenceAttention, SDPAAttention])
@pytest.mark.parametrize("window", [0, 3, 20])
def test_cached_attention_matches_masked_attention(backend, window):
    args = neox_args(
        num_attention_heads=NQ, num_kv_heads=NKV, hidden_size=NQ * D, sliding_window_width=window
    )
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(S, B, n, D, generator=gen) for n in (NQ, NKV, NKV))
    expected = windowed_attention(q, k, v, window)
    cached = CachedAttention(backend(args, layer_number=2).eval(), KVCache(), layer=0)
    # prefill 4 (past W=3), then a chunk of 2 (queries aligned to the end), then single tokens
    cuts = [0, 4, 6, *range(7, S + 1)]
    steps = [cached(q[a:b], k[a:b], v[a:b]) for a, b in zip(cuts, cuts[1:])]
    assert_close(torch.cat(steps), expected, f"cached {backend.__name__} W={window}", tol=1e-6)


@pytest.mark.parametrize("kind", ["global", "sdpa"])
@pytest.mark.parametrize("window", [3, 20])
def test_cached_generation_slides_the_window(kind, window):
    args = llama_args(sliding_window_width=window, layer_attention_types=(kind,) * 4)
    model = build_gpt(args).eval()
    tokens = torch.randint(0, args.vocab_size, (2, 12), generator=torch.Generator().manual_seed(4))
    positions = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        full = model(tokens, positions)
        steps = []
        with kv_cache(model):
            steps.append(model(tokens[:, :5], positions[:, :5]))  # prefill past the window
            for t in range(5, 12):
                steps.append(model(tokens[:, t : t + 1], positions[:, t : t + 1]))
        unwindowed = build_gpt(llama_args(layer_attention_types=(kind,) * 4)).eval()
        unwindowed.load_state_dict(model.state_dict())
        without = unwindowed(tokens, positions)
    assert_close(torch.cat(steps, dim=1), full, f"cached {kind} vs full forward", tol=1e-5)
    inside = min(window + 1, 12)  # positions whose every key is inside the window
    assert_close(full[:, :inside], without[:, :inside], "positions inside the window", tol=1e-5)
    if window < 12:
        assert (full[:, inside:] - without[:, inside:]).abs().max() > 1e-3  # the window is in force


def z_loss_formula(logits, targets, mask, z):
    ce = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), reduction="none"
    )
    lse = logits.logsumexp(-1).flatten()
    m = mask.flatten()
    return (ce * m).sum() / m.sum() + z * (lse.square() * m).sum() / m.sum()


def z_loss_inputs():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 7, 16, generator=gen) * 3
    targets = torch.randint(0, 16, (2, 7), generator=gen)
    mask = (torch.rand(2, 7, generator=gen) > 0.3).float()
    return logits, targets, mask


def test_z_loss_is_the_palm_term_over_the_loss_mask():
    logits, targets, mask = z_loss_inputs()
    expected = z_loss_formula(logits, targets, mask, 1e-2)
    actual = loss_fn(logits, (targets, mask), z_loss=1e-2)
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    plain = loss_fn(logits, (targets, mask))
    torch.testing.assert_close(plain, z_loss_formula(logits, targets, mask, 0.0))
    assert actual > plain


# The true vocabulary of the padded case: columns 11-15 are padding (5 of rank 1's 8 at tp=2).
TOKENS = 11


def padded_z_loss_inputs():
    """`z_loss_inputs` with targets among the first `TOKENS` columns and padding logits far
    above the tokens' (they would take all the probability mass)."""
    logits, targets, mask = z_loss_inputs()
    logits[..., TOKENS:] += 40.0
    return logits, targets % TOKENS, mask


def _z_loss_tp2(rank, world_size):
    import torch.distributed as dist

    out = []
    for inputs, vocab in ((z_loss_inputs, None), (padded_z_loss_inputs, TOKENS)):
        logits, targets, mask = inputs()
        part = logits.chunk(world_size, -1)[rank].clone().requires_grad_(True)
        group = dist.group.WORLD
        loss = loss_fn(part, (targets, mask), tp_group=group, z_loss=1e-2, vocab_size=vocab)
        loss.backward()
        out.append((loss.item(), part.grad))
    return out


def test_z_loss_with_the_vocabulary_split_over_tp2():
    """Without padding, and with padding columns, which the loss and the z-loss leave out: the
    formula over the token columns alone, and a zero gradient for the padding."""
    results = run_distributed(_z_loss_tp2, 2)
    for case, (inputs, vocab) in enumerate(((z_loss_inputs, None), (padded_z_loss_inputs, TOKENS))):
        logits, targets, mask = inputs()
        full = logits.clone().requires_grad_(True)
        expected = z_loss_formula(full[..., :vocab], targets, mask, 1e-2)
        expected.backward()  # the padding columns' gradient: zero
        one_rank = logits.clone().requires_grad_(True)
        loss_fn(one_rank, (targets, mask), z_loss=1e-2, vocab_size=vocab).backward()
        torch.testing.assert_close(one_rank.grad, full.grad, rtol=1e-5, atol=1e-6)
        for rank, result in enumerate(results):
            value, grad = result[case]
            assert value == pytest.approx(expected.item(), rel=1e-6)
            torch.testing.assert_close(grad, full.grad.chunk(2, -1)[rank], rtol=1e-5, atol=1e-6)


def test_qkv_only_bias_and_explicit_head_dim_are_built_as_counted():
    args = llama_args(use_bias_in_qkv=True, head_dim=12, use_qk_layernorm=True)
    model = build_gpt(args)
    attention = model.get_submodule("2.attention")
    assert attention.query_key_value.bias is not None and attention.dense.bias is None
    assert attention.query_key_value.weight.shape == ((4 + 2 * 2) * 12, 32)
    assert attention.dense.weight.shape == (32, 4 * 12)
    layer = model.get_submodule("2")
    assert sum(p.numel() for p in layer.parameters()) == layer_parameters(args)


MODEL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16,
             train_micro_batch_size_per_gpu=1, lr=1e-4)  # fmt: skip


def test_config_keys_are_accepted_and_checked():
    cfg = config_from_dict(
        {**MODEL, "sliding_window_width": 4, "z_loss": 1e-4, "head_dim": 12}, vocab_size=100
    )
    assert (cfg.model.sliding_window_width, cfg.model.z_loss, cfg.model.head_dim) == (4, 1e-4, 12)
    for key, value in (("sliding_window_width", -1), ("z_loss", -0.1), ("head_dim", 0)):
        with pytest.raises(ConfigError, match=key):
            config_from_dict({**MODEL, key: value}, vocab_size=100)
