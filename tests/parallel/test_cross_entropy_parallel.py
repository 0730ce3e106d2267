"""Vocab-parallel cross entropy at tp=2 and tp=4 against `F.cross_entropy` on the full logits.

One spawn of 4 gloo ranks. Each rank holds its vocabulary slice of the same logits; the
per-token loss and the gathered gradient must equal the single-process result within 1e-6
relative, with and without label smoothing, for (s, b, V) logits and for huge logits that
overflow a naive softmax; with vocabulary padding over the last two ranks, the
loss and gradient of `F.cross_entropy` over the token columns alone, the padding's gradient
exactly zero (a rank holding only padding included). Then the same for bf16 logits through
the fused softmax kernels a GPU takes (`FUSED_PASSES`, forced here): the loss of the same values
upcast, the gradient rounded to bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.parallel import ParallelTopology, gather_from_tensor_parallel_region
from megatron.parallel import vocab_parallel_cross_entropy as vp_ce
from tests.distributed import run_distributed

TOL = 1e-6


def assert_close(actual, expected, what):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = (actual - expected).abs().max().item()
    scale = max(expected.abs().max().item(), 1e-30)
    assert err <= TOL * scale, f"{what}: max error {err:.3e} vs max value {scale:.3e}"


def check_against_full(topo, logits, target, label_smoothing, vocab=None):
    """`vocab`: the true vocabulary, the columns after it padding (None: no padding); the
    reference is `F.cross_entropy` over the token columns alone."""
    local = logits.chunk(topo.tp_size, dim=-1)[topo.tp_rank].clone().requires_grad_()
    before = local.detach().clone()
    loss = vp_ce(local, target, topo.tp_group, label_smoothing=label_smoothing, vocab_size=vocab)
    assert torch.equal(local.detach(), before), "the caller's logits were modified"

    full = logits.clone().requires_grad_()
    tokens = full[..., :vocab]
    ref = F.cross_entropy(
        tokens.reshape(-1, tokens.shape[-1]),
        target.view(-1),
        reduction="none",
        label_smoothing=label_smoothing,
    ).view(target.shape)
    what = f"tp={topo.tp_size} smoothing={label_smoothing} logits~{logits.abs().max():.0f}"
    what += f" vocab={vocab}"
    assert_close(loss, ref, f"loss, {what}")

    weights = torch.rand(target.shape)  # a loss mask-like upstream gradient
    (loss * weights).sum().backward()
    (ref * weights).sum().backward()
    grad = gather_from_tensor_parallel_region(local.grad, topo.tp_group)
    assert_close(grad, full.grad, f"grad, {what}")
    if vocab is not None:
        assert not grad[..., vocab:].any(), f"padding got a gradient, {what}"


def check_fused_bf16(topo, logits, target, label_smoothing, vocab=None):
    """bf16 logits through the fused passes: F.cross_entropy on the same values in fp32."""
    local = logits.chunk(topo.tp_size, dim=-1)[topo.tp_rank].clone().requires_grad_()
    loss = vp_ce(local, target, topo.tp_group, label_smoothing=label_smoothing, vocab_size=vocab)
    full = logits.float().requires_grad_()
    tokens = full[..., :vocab]
    ref = F.cross_entropy(tokens.reshape(-1, tokens.shape[-1]), target.view(-1),
                          reduction="none", label_smoothing=label_smoothing)  # fmt: skip
    ref = ref.view(target.shape)
    what = f"fused bf16, tp={topo.tp_size} smoothing={label_smoothing} vocab={vocab}"
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5, msg=what)
    weights = torch.rand(target.shape)
    (loss * weights).sum().backward()
    (ref * weights).sum().backward()
    grad = gather_from_tensor_parallel_region(local.grad, topo.tp_group)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad, full.grad.to(torch.bfloat16), msg=what)
    if vocab is not None:
        assert not grad[..., vocab:].any(), f"padding got a gradient, {what}"


def _fused_bf16(tp):
    from megatron.parallel import cross_entropy

    default = cross_entropy.FUSED_PASSES
    cross_entropy.FUSED_PASSES = {"cpu": {torch.bfloat16}}  # forced, on the CPU
    try:
        topo = ParallelTopology(tp_size=tp)
        torch.manual_seed(8)
        seq, batch, vocab = 6, 3, 8 * tp
        logits = (torch.randn(seq, batch, vocab) * 3).to(torch.bfloat16)
        target = torch.randint(0, vocab, (seq, batch))
        for label_smoothing in (0.0, 0.1):
            check_fused_bf16(topo, logits, target, label_smoothing)
            padded = logits.clone()
            padded[..., vocab - 11 :] += 100
            check_fused_bf16(topo, padded, target % (vocab - 11), label_smoothing, vocab - 11)
    finally:
        cross_entropy.FUSED_PASSES = default


def _worker(rank, world_size):
    for tp in (2, 4):
        topo = ParallelTopology(tp_size=tp)
        torch.manual_seed(7)  # identical logits and targets on every rank
        seq, batch, vocab = 6, 3, 8 * tp
        logits = torch.randn(seq, batch, vocab) * 3
        target = torch.randint(0, vocab, (seq, batch))
        target[0, :] = torch.tensor([0, vocab - 1, vocab // tp])  # slice edges
        for label_smoothing in (0.0, 0.1):
            check_against_full(topo, logits, target, label_smoothing)
        # exp(1e4) overflows fp32: the global-max shift keeps it finite and exact.
        check_against_full(topo, logits * 1e4, target, 0.0)
        # Padding: the last 11 columns, more than the last rank's 8 (it holds only padding,
        # the rank before it some), their logits far above the tokens'.
        vocab = 8 * tp - 11
        padded = logits.clone()
        padded[..., vocab:] += 1e3
        for label_smoothing in (0.0, 0.1):
            check_against_full(topo, padded, target % vocab, label_smoothing, vocab)
        _fused_bf16(tp)
    return True


def test_vocab_parallel_cross_entropy_matches_full_vocab_at_tp2_and_tp4():
    assert run_distributed(_worker, 4) == [True] * 4
