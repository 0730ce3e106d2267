"""`linear_cross_entropy` (one process) against formulas we did not write.

The reference is `torch.nn.functional.cross_entropy` on the full logits `hidden @ weight.T`
(their true-vocabulary columns) with its own `label_smoothing`, plus PaLM's z-loss written out
here (`z · logsumexp(logits)²`), masked-mean over the tokens, differentiated by autograd:

- fp32: the loss and the gradients of the hidden states and of the weight within 1e-6 relative
  (fp64 reference), over chunk sizes from one token to more than the batch, with and without
  vocabulary padding, label smoothing and z-loss;
- bf16: the unfused bf16 path (bf16 logits from the bf16 head, upcast for the loss, the
  gradient cast back to bf16 for the two bf16 matrix multiplies) within bf16 rounding;
- fp16 at token weights whose logits' gradient lies below fp16's range (a mean over 16k
  tokens, a weight of 2^-16), backward at a loss scale as DeepSpeed's fp16 engines run it:
  the loss and both gradients within fp16 rounding of the fp64 reference; at a loss scale too
  large for fp16 both gradients overflow to inf, as the unfused fp16 head's do;
- the upstream gradient is a scalar factor (a loss scale) and reaches both gradients;
- under `torch.no_grad` the same loss, and no gradient buffers are made;
- the padding rows of the weight get exactly zero gradient;
- a second backward (which would scale the stored gradients twice) is refused by autograd;
- invalid arguments raise `ValueError`;
- `linear_log_probs` (DPO/KTO's per-token log-probabilities, the backward recomputing each
  chunk): `F.log_softmax` of the full logits at the targets, and its gradients for an arbitrary
  per-token upstream gradient, within 1e-6 in fp32, bf16 rounding in bf16 and fp16 rounding in
  fp16 (its upstream gradient carries the loss scale, so fp16 needs nothing more there).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from megatron.parallel.chunked_cross_entropy import linear_cross_entropy, linear_log_probs

TOKENS, HIDDEN, PADDED = 29, 12, 40


def _batch(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen).to(dtype)
    weight = (torch.randn(PADDED, HIDDEN, generator=gen) * 0.7).to(dtype)
    mask = (torch.rand(TOKENS, generator=gen) > 0.3).float()
    return hidden, weight, mask, gen


def _reference(hidden, weight, target, mask, vocab, eps, z):
    """Masked-mean F.cross_entropy (+ PaLM z-loss) on the full logits, and its gradients."""
    hidden = hidden.detach().double().requires_grad_()
    weight = weight.detach().double().requires_grad_()
    logits = (hidden @ weight.t())[:, :vocab]  # (tokens, V): the true vocabulary only
    ce = F.cross_entropy(logits, target, reduction="none", label_smoothing=eps)
    z_term = z * torch.logsumexp(logits, dim=-1) ** 2  # PaLM (Chowdhery et al. 2022, §5)
    loss = ((ce + z_term) * mask.double()).sum() / mask.double().sum()
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


def _rel(actual, expected) -> float:
    return ((actual.double() - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("vocab", [PADDED, 33])
@pytest.mark.parametrize(("eps", "z"), [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-2), (0.2, 1e-3)])
def test_fp32_matches_cross_entropy_on_the_full_logits(chunk, vocab, eps, z):
    hidden, weight, mask, gen = _batch(torch.float32)
    target = torch.randint(0, vocab, (TOKENS,), generator=gen)
    ref_loss, ref_gh, ref_gw = _reference(hidden, weight, target, mask, vocab, eps, z)
    hidden.requires_grad_()
    weight.requires_grad_()
    weights = mask / mask.sum()
    loss = linear_cross_entropy(
        hidden,
        weight,
        target,
        weights,
        z_weights=z * weights if z else None,
        label_smoothing=eps,
        vocab_size=vocab,
        chunk_tokens=chunk,
    )
    loss.backward()
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref_loss.item()) <= 1e-6 * abs(ref_loss.item())
    assert _rel(hidden.grad, ref_gh) <= 1e-6
    assert _rel(weight.grad, ref_gw) <= 1e-6
    assert not weight.grad[vocab:].any()  # padding rows: exactly no gradient


@pytest.mark.parametrize(("eps", "z"), [(0.0, 0.0), (0.1, 1e-2)])
def test_bf16_matches_the_unfused_bf16_path(eps, z):
    hidden, weight, mask, gen = _batch(torch.bfloat16, seed=1)
    vocab = 33
    target = torch.randint(0, vocab, (TOKENS,), generator=gen)
    # The unfused path: the bf16 head writes bf16 logits, the loss upcasts them.
    h_ref = hidden.clone().requires_grad_()
    w_ref = weight.clone().requires_grad_()
    logits = (h_ref @ w_ref.t())[:, :vocab].float()
    ce = F.cross_entropy(logits, target, reduction="none", label_smoothing=eps)
    ref = ((ce + z * torch.logsumexp(logits, -1) ** 2) * mask).sum() / mask.sum()
    ref.backward()
    hidden.requires_grad_()
    weight.requires_grad_()
    weights = mask / mask.sum()
    loss = linear_cross_entropy(
        hidden,
        weight,
        target,
        weights,
        z_weights=z * weights if z else None,
        label_smoothing=eps,
        vocab_size=vocab,
        chunk_tokens=8,
    )
    loss.backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.bfloat16
    assert abs(loss.item() - ref.item()) <= 1e-6 * abs(ref.item())  # fp32 math on the same logits
    bf16_rounding = 2.0**-8  # a relative step of bf16's 8-bit significand
    assert _rel(hidden.grad, h_ref.grad.double()) <= bf16_rounding
    assert _rel(weight.grad, w_ref.grad.double()) <= bf16_rounding


FP16_LOSS_SCALE = 2.0**12  # a dynamic loss scale where DeepSpeed's scaler settles for small models
FP16_ROUNDING = 2.0**-10  # two steps of fp16's 11-bit significand: the logits' own rounding


def _fp16_batch(tokens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, 16, generator=gen).half()
    weight = (torch.randn(512, 16, generator=gen) * 0.7).half()
    target = torch.randint(0, 500, (tokens,), generator=gen)
    mask = (torch.rand(tokens, generator=gen) > 0.3).double()
    return hidden, weight, target, mask


@pytest.mark.parametrize(
    ("tokens", "token_weight", "eps", "z"), [(16384, None, 0.0, 0.0), (4096, 2.0**-16, 0.1, 1e-2)]
)
def test_fp16_matches_cross_entropy_where_the_logits_gradient_is_below_fp16s_range(
    tokens, token_weight, eps, z
):
    """A token's logits gradient is its weight times (softmax - onehot): at a mean over 16k
    tokens and a 500-token vocabulary about 2^-14 · 2^-9, at a weight of 2^-16 smaller still,
    below fp16's normal range (2^-14) before any loss scale multiplies it. Made in fp16 in the
    forward it cost the hidden states' gradient 0.3-2%; lifted by a power of two per chunk, it
    keeps fp16's rounding of the logits themselves (4-5e-4)."""
    hidden, weight, target, mask = _fp16_batch(tokens)
    weights = mask / mask.sum() if token_weight is None else mask * token_weight
    h_ref = hidden.double().requires_grad_()
    w_ref = weight.double().requires_grad_()
    logits = (h_ref @ w_ref.t())[:, :500]
    ce = F.cross_entropy(logits, target, reduction="none", label_smoothing=eps)
    ref = ((ce + z * torch.logsumexp(logits, -1) ** 2) * weights).sum()
    ref.backward()
    hidden.requires_grad_()
    weight.requires_grad_()
    loss = linear_cross_entropy(
        hidden,
        weight,
        target,
        weights.float(),
        z_weights=(z * weights).float() if z else None,
        label_smoothing=eps,
        vocab_size=500,
        chunk_tokens=1024,
    )
    (FP16_LOSS_SCALE * loss).backward()  # as DeepSpeed's fp16 engines scale the loss
    assert loss.dtype == torch.float32
    assert hidden.grad.dtype == weight.grad.dtype == torch.float16
    assert abs(loss.item() - ref.item()) <= 1e-5 * abs(ref.item())
    assert _rel(hidden.grad.double() / FP16_LOSS_SCALE, h_ref.grad) <= FP16_ROUNDING
    assert _rel(weight.grad.double() / FP16_LOSS_SCALE, w_ref.grad) <= FP16_ROUNDING
    assert not weight.grad[500:].any()


def test_fp16_gradients_overflow_at_a_loss_scale_too_large_as_the_unfused_heads_do():
    """The gradients stay fp32 until the upstream scalar (the loss scale) multiplies them, so
    a scale too large for fp16 gives inf where the unfused head's fp16 gradients hold inf too:
    DeepSpeed's dynamic loss scaler sees the overflow and halves the scale."""
    hidden, weight, target, mask = _fp16_batch(8192, seed=1)
    weights = (mask / mask.sum()).float()
    h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logits = (h_ref @ w_ref.t())[:, :500].float()
    ce = F.cross_entropy(logits, target, reduction="none")
    (2.0**40 * (ce * weights).sum()).backward()
    hidden.requires_grad_()
    weight.requires_grad_()
    loss = linear_cross_entropy(hidden, weight, target, weights, vocab_size=500, chunk_tokens=8)
    (2.0**40 * loss).backward()
    for fused, unfused in ((hidden.grad, h_ref.grad), (weight.grad, w_ref.grad)):
        assert not torch.isfinite(unfused).all()
        assert not torch.isfinite(fused).all()


def test_the_upstream_scalar_scales_both_gradients():
    hidden, weight, mask, gen = _batch(torch.float32, seed=2)
    target = torch.randint(0, PADDED, (TOKENS,), generator=gen)
    grads = []
    for factor in (1.0, 1024.0):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        (factor * linear_cross_entropy(h, w, target, mask / mask.sum(), chunk_tokens=5)).backward()
        grads.append((h.grad, w.grad))
    torch.testing.assert_close(grads[1][0], 1024.0 * grads[0][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(grads[1][1], 1024.0 * grads[0][1], rtol=1e-6, atol=0)


def test_a_second_backward_is_refused():
    hidden, weight, mask, gen = _batch(torch.float32, seed=6)
    target = torch.randint(0, PADDED, (TOKENS,), generator=gen)
    hidden.requires_grad_()
    loss = linear_cross_entropy(hidden, weight, target, mask / mask.sum(), chunk_tokens=8)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_no_grad_gives_the_loss_alone():
    hidden, weight, mask, gen = _batch(torch.float32, seed=3)
    target = torch.randint(0, 33, (TOKENS,), generator=gen)
    weights = mask / mask.sum()
    hidden.requires_grad_()
    with_grad = linear_cross_entropy(hidden, weight, target, weights, vocab_size=33, chunk_tokens=8)
    with torch.no_grad():
        without = linear_cross_entropy(
            hidden, weight, target, weights, vocab_size=33, chunk_tokens=8
        )
    assert without.grad_fn is None
    assert torch.equal(with_grad.detach(), without)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(chunk_tokens=0), "chunk_tokens"),
        (dict(label_smoothing=1.0), "label_smoothing"),
        (dict(vocab_size=PADDED + 1), "vocab_size"),
        (dict(target=torch.zeros(3, dtype=torch.long)), "target"),
    ],
)
def test_invalid_arguments_raise(change, message):
    hidden, weight, mask, _ = _batch(torch.float32)
    kwargs = dict(target=torch.zeros(TOKENS, dtype=torch.long), chunk_tokens=8)
    kwargs.update(change)
    target = kwargs.pop("target")
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(hidden, weight, target, mask, **kwargs)


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("vocab", [PADDED, 33])
def test_log_probs_match_log_softmax_for_any_upstream_gradient(chunk, vocab):
    hidden, weight, _, gen = _batch(torch.float32, seed=4)
    target = torch.randint(0, vocab, (TOKENS,), generator=gen)
    upstream = torch.randn(TOKENS, generator=gen, dtype=torch.float64)  # per token, any sign
    h_ref = hidden.double().requires_grad_()
    w_ref = weight.double().requires_grad_()
    logits = (h_ref @ w_ref.t())[:, :vocab]
    ref = F.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    (ref * upstream).sum().backward()
    hidden.requires_grad_()
    weight.requires_grad_()
    logps = linear_log_probs(hidden, weight, target, vocab_size=vocab, chunk_tokens=chunk)
    (logps * upstream.float()).sum().backward()
    assert logps.dtype == torch.float32
    torch.testing.assert_close(logps.double(), ref.detach(), rtol=1e-6, atol=1e-6)
    assert _rel(hidden.grad, h_ref.grad) <= 1e-6
    assert _rel(weight.grad, w_ref.grad) <= 1e-6
    assert not weight.grad[vocab:].any()


def test_bf16_log_probs_match_the_unfused_bf16_path():
    hidden, weight, _, gen = _batch(torch.bfloat16, seed=5)
    target = torch.randint(0, 33, (TOKENS,), generator=gen)
    upstream = torch.randn(TOKENS, generator=gen)
    h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logits = (h_ref @ w_ref.t())[:, :33].float()
    ref = F.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    (ref * upstream).sum().backward()
    hidden.requires_grad_()
    weight.requires_grad_()
    logps = linear_log_probs(hidden, weight, target, vocab_size=33, chunk_tokens=8)
    (logps * upstream).sum().backward()
    torch.testing.assert_close(logps, ref.detach(), rtol=1e-6, atol=1e-5)
    assert _rel(hidden.grad, h_ref.grad.double()) <= 2.0**-8
    assert _rel(weight.grad, w_ref.grad.double()) <= 2.0**-8


def test_fp16_log_probs_match_log_softmax_at_a_loss_scaled_upstream_gradient():
    """DPO/KTO's log-probabilities make their logits' gradient in the backward, from the
    upstream gradient that carries the fp16 loss scale (as the unfused head's does): within
    fp16 rounding of the fp64 reference, and the log-probabilities within the fp16 logits'
    rounding (2^-11 of logits about 10)."""
    hidden, weight, target, _ = _fp16_batch(4096, seed=2)
    gen = torch.Generator().manual_seed(3)
    upstream = torch.randn(4096, generator=gen, dtype=torch.float64) / 4 * FP16_LOSS_SCALE
    h_ref = hidden.double().requires_grad_()
    w_ref = weight.double().requires_grad_()
    logits = (h_ref @ w_ref.t())[:, :500]
    ref = F.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    (ref * upstream).sum().backward()
    hidden.requires_grad_()
    weight.requires_grad_()
    logps = linear_log_probs(hidden, weight, target, vocab_size=500, chunk_tokens=1024)
    (logps * upstream.float()).sum().backward()
    assert logps.dtype == torch.float32
    torch.testing.assert_close(logps.double(), ref.detach(), rtol=0, atol=2e-2)
    assert hidden.grad.dtype == weight.grad.dtype == torch.float16
    assert _rel(hidden.grad, h_ref.grad) <= FP16_ROUNDING
    assert _rel(weight.grad, w_ref.grad) <= FP16_ROUNDING
