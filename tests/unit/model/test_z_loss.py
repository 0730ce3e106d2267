"""The z-loss from the cross entropy's own logsumexp: the loss and its gradient equal PaLM's
formula written here in fp64 (`z · mean over unmasked tokens of logsumexp(logits)²`, plus the
masked mean cross entropy), over the true vocabulary of padded logits, and the logits are still
consumed: no logits-sized buffer is written (the z-loss used to read an fp32 copy of the logits
after the loss and so turned consumption off)."""

from __future__ import annotations

import pytest
import torch

from megatron.model.loss import bound_loss_fn, loss_fn
from megatron.parallel import cross_entropy
from tests.unit.parallel.test_cross_entropy_single import NewLargeTensors

# every 16-bit dtype through the fused kernels, on the CPU too (a GPU takes them for fp16)
FORCED_FUSED = {"cpu": {torch.bfloat16, torch.float16}, "cuda": {torch.bfloat16, torch.float16}}

VOCAB, PADDED, Z = 17, 24, 0.05


@pytest.fixture(params=["one chunk", "chunks of 3 rows", "fused passes, chunks of 3 rows"])
def chunked(request, monkeypatch):
    if request.param != "one chunk":
        monkeypatch.setitem(cross_entropy.CHUNK_BYTES, "cpu", 3 * PADDED * 4)
    if request.param.startswith("fused"):  # a GPU's path for bf16/fp16 logits
        monkeypatch.setattr(cross_entropy, "FUSED_PASSES", FORCED_FUSED)


def reference_loss(logits: torch.Tensor, labels, mask) -> torch.Tensor:
    """Masked mean of cross entropy + Z · logsumexp² over the token columns, in fp64."""
    x = logits.double()[..., :VOCAB]
    lse = torch.logsumexp(x, dim=-1)  # (b, s)
    ce = lse - x.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    mask = mask.double()
    return ((ce + Z * lse.square()) * mask).sum() / mask.sum()


def batch(seed: int = 0):
    """Hidden states, labels and a loss mask with some zeros; the logits' offset makes
    logsumexp large (about 5), so the z-term moves the loss and the gradient."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 5, 8, generator=g)
    labels = torch.randint(0, VOCAB, (3, 5), generator=g)
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    weight = torch.randn(PADDED, 8, generator=g)
    return hidden, labels, mask, weight


def test_value_and_logits_gradient_match_the_fp64_formula(chunked):
    hidden, labels, mask, weight = batch()
    logits = (hidden @ weight.t() + 3.0).requires_grad_()
    ref_logits = logits.detach().clone().requires_grad_()
    loss = loss_fn(logits, (labels, mask), z_loss=Z, vocab_size=VOCAB)
    ref = reference_loss(ref_logits, labels, mask)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    loss.backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad.float(), rtol=1e-5, atol=1e-7)
    assert not logits.grad[..., VOCAB:].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_consumed_logits_give_the_formulas_weight_gradient(dtype, chunked):
    """As training calls it (`bound_loss_fn`: the head's output consumed), the loss and the
    head's weight gradient are the fp64 formula's (bf16: within bf16 rounding)."""
    hidden, labels, mask, weight = batch(1)
    weight = weight.to(dtype).requires_grad_()
    ref_weight = weight.detach().double().requires_grad_()
    logits = hidden.to(dtype) @ weight.t() + 3.0
    loss = bound_loss_fn(z_loss=Z, vocab_size=VOCAB)(logits, (labels, mask))
    ref = reference_loss(hidden.double() @ ref_weight.t() + 3.0, labels, mask)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(loss.double(), ref, **tol)
    loss.backward()
    ref.backward()
    torch.testing.assert_close(weight.grad.double(), ref_weight.grad, **tol)


def test_the_z_term_reaches_the_gradient():
    """The z-term's own gradient, 2 Z lse softmax, is there: without it the gradient would be
    the cross entropy's alone, which this checks it is not."""
    hidden, labels, mask, weight = batch(2)
    with_z, without = [(hidden @ weight.t() + 3.0).requires_grad_() for _ in range(2)]
    loss_fn(with_z, (labels, mask), z_loss=Z, vocab_size=VOCAB).backward()
    loss_fn(without, (labels, mask), vocab_size=VOCAB).backward()
    x = without.detach()[..., :VOCAB].double()
    z_term = 2 * Z * x.logsumexp(-1, keepdim=True) * x.softmax(-1) * mask[..., None] / mask.sum()
    difference = (with_z.grad - without.grad)[..., :VOCAB].double()
    torch.testing.assert_close(difference, z_term, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_z_loss_writes_no_logits_sized_buffer(dtype, monkeypatch):
    """Forward and backward of the training loss with the z-loss on, logits several chunks
    long, consumed: no new buffer of the logits' size (it was an fp32 copy of the logits, the
    shifted copy, exp, and the cross entropy's own softmax or gradient buffer)."""
    tokens, vocab, padded = 64, 500, 512
    monkeypatch.setitem(cross_entropy.CHUNK_BYTES, "cpu", 8 * padded * 4)  # 8 of 64 rows
    weight = torch.randn(padded, 8).to(dtype).requires_grad_()
    hidden = torch.randn(4, tokens // 4, 8).to(dtype)
    labels = torch.randint(0, vocab, (4, tokens // 4))
    mask = torch.ones(4, tokens // 4)
    logits = hidden @ weight.t()
    with NewLargeTensors(tokens * vocab // 2) as counted:
        bound_loss_fn(z_loss=1e-4, vocab_size=vocab)(logits, (labels, mask)).backward()
    assert counted.ops == [], counted.ops
