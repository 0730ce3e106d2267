"""vocab_parallel_cross_entropy without tensor parallelism: F.cross_entropy, dtypes, errors,
the padding columns of the vocabulary masked out, and how many logits-sized buffers it writes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.parallel import cross_entropy, vocab_parallel_cross_entropy
from megatron.parallel.cross_entropy import _VocabParallelCrossEntropy

# every 16-bit dtype through the fused kernels, on the CPU too (a GPU takes them for fp16)
FORCED_FUSED = {"cpu": {torch.bfloat16, torch.float16}, "cuda": {torch.bfloat16, torch.float16}}


@pytest.fixture(params=["one chunk", "chunks of 3 rows", "fused passes, chunks of 3 rows"])
def chunked(request, monkeypatch):
    """The default chunk size (these logits fit one chunk), and chunks of 3 rows of 17 or 24
    columns, so that the tokens span several chunks with a shorter last one; then the same
    chunks through the fused softmax kernels a GPU's bf16/fp16 logits take (FUSED_PASSES)."""
    if request.param != "one chunk":
        monkeypatch.setitem(cross_entropy.CHUNK_BYTES, "cpu", 3 * 24 * 4)
    if request.param.startswith("fused"):
        monkeypatch.setattr(cross_entropy, "FUSED_PASSES", FORCED_FUSED)


def sharded_path(logits, target, label_smoothing=0.0, vocab_size=None):
    """The vocab-parallel autograd function itself, called directly: (loss, logsumexp)."""
    return _VocabParallelCrossEntropy.apply(
        logits, target, None, float(label_smoothing), vocab_size
    )[0]


@pytest.mark.parametrize("fn", [vocab_parallel_cross_entropy, sharded_path])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_matches_torch_cross_entropy(label_smoothing, fn, chunked):
    torch.manual_seed(0)
    logits = (torch.randn(5, 3, 17) * 4).requires_grad_()
    target = torch.randint(0, 17, (5, 3))
    ref_logits = logits.detach().clone().requires_grad_()
    loss = fn(logits, target, label_smoothing=label_smoothing)
    ref = F.cross_entropy(
        ref_logits.view(-1, 17), target.view(-1), reduction="none", label_smoothing=label_smoothing
    ).view(5, 3)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    up = torch.rand(5, 3)
    (loss * up).sum().backward()
    (ref * up).sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fn", [vocab_parallel_cross_entropy, sharded_path])
def test_float64_gradient_is_exact(fn, chunked):
    # (gradcheck itself needs several backwards per forward, which this function refuses.)
    torch.manual_seed(1)
    logits = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 6, (4,))
    fn(logits, target, label_smoothing=0.1).sum().backward()
    onehot = F.one_hot(target, 6).double()
    expected = logits.detach().softmax(-1) - 0.9 * onehot - 0.1 / 6
    torch.testing.assert_close(logits.grad, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("fn", [vocab_parallel_cross_entropy, sharded_path])
def test_bf16_logits_give_fp32_loss_and_bf16_grad(fn, chunked):
    """The loss of bf16 logits is fp32 and equals torch's cross entropy of the upcast logits;
    the gradient is the fp32 gradient rounded once to bf16."""
    torch.manual_seed(4)
    logits = (torch.randn(7, 24) * 4).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, 24, (7,))
    ref_logits = logits.detach().float().requires_grad_()
    loss = fn(logits, target)
    assert loss.dtype == torch.float32
    ref = F.cross_entropy(ref_logits, target, reduction="none")
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    up = torch.rand(7)
    (loss * up).sum().backward()
    (ref * up).sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad, ref_logits.grad.to(torch.bfloat16))


def test_errors():
    logits = torch.randn(3, 8, requires_grad=True)
    with pytest.raises(ValueError, match=r"target shape \(3, 1\) must equal"):
        vocab_parallel_cross_entropy(logits, torch.zeros(3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\)"):
        vocab_parallel_cross_entropy(logits, torch.zeros(3, dtype=torch.long), label_smoothing=1)

    loss = sharded_path(logits, torch.zeros(3, dtype=torch.long)).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward per forward"):
        loss.backward()


@pytest.mark.parametrize("fn", [vocab_parallel_cross_entropy, sharded_path])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_padding_columns_are_masked_out(label_smoothing, fn, chunked):
    """With the true vocabulary 17 of 24 padded columns, the loss is `F.cross_entropy` over the
    17 token columns alone (label smoothing averaging over them), however large the padding
    logits are, and the padding columns get exactly zero gradient."""
    torch.manual_seed(2)
    vocab, padded = 17, 24
    logits = torch.randn(5, 3, padded) * 4
    logits[..., vocab:] = 50.0 + torch.rand(5, 3, padded - vocab)  # would take all the mass
    logits.requires_grad_()
    target = torch.randint(0, vocab, (5, 3))
    target[0] = vocab - 1
    tokens_only = logits.detach()[..., :vocab].clone().requires_grad_()
    loss = fn(logits, target, label_smoothing=label_smoothing, vocab_size=vocab)
    ref = F.cross_entropy(
        tokens_only.reshape(-1, vocab),
        target.view(-1),
        reduction="none",
        label_smoothing=label_smoothing,
    ).view(5, 3)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    up = torch.rand(5, 3)
    (loss * up).sum().backward()
    (ref * up).sum().backward()
    torch.testing.assert_close(logits.grad[..., :vocab], tokens_only.grad, rtol=1e-6, atol=1e-7)
    assert torch.equal(logits.grad[..., vocab:], torch.zeros(5, 3, padded - vocab))


def test_true_vocabulary_beyond_the_logits_is_refused():
    with pytest.raises(ValueError, match=r"vocab_size 9 \(the true vocabulary\) must be in 1..8"):
        vocab_parallel_cross_entropy(
            torch.randn(3, 8), torch.zeros(3, dtype=torch.long), None, 0, 9
        )


class NewLargeTensors(TorchDispatchMode):
    """Counts the operator outputs of at least `numel` elements that are new memory (not a view
    or an in-place update of an input): the full passes an op writes over the logits."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() >= self.numel:
                if t.untyped_storage().data_ptr() not in inputs:
                    self.ops.append(str(func))
        return out


@pytest.mark.parametrize("fused", [False, True], ids=["passes", "fused passes"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_logits_sized_buffer_at_tp1(dtype, fused, monkeypatch):
    """Forward and backward at tp 1 with a padded vocabulary, over logits several chunks long,
    write one buffer of the logits' size: the gradient. The softmax passes run a chunk at a
    time. `F.cross_entropy` over the token columns wrote four (the log-softmax, the
    zero-filled NLL gradient, the log-softmax gradient, the zero-filled gradient of the
    slice): at a 50k vocabulary each such pass costs about as much as the output head's
    matrix multiply on a CPU."""
    tokens, vocab, padded = 64, 500, 512
    monkeypatch.setitem(cross_entropy.CHUNK_BYTES, "cpu", 8 * padded * 4)  # 8 of 64 rows
    if fused:  # a GPU's path for bf16 logits (FUSED_PASSES)
        monkeypatch.setattr(cross_entropy, "FUSED_PASSES", FORCED_FUSED)
    logits = torch.randn(4, tokens // 4, padded).to(dtype).requires_grad_()
    target = torch.randint(0, vocab, (4, tokens // 4))
    with NewLargeTensors(tokens * vocab // 2) as counted:
        vocab_parallel_cross_entropy(logits, target, vocab_size=vocab).sum().backward()
    assert len(counted.ops) == 1, counted.ops
    assert logits.grad.dtype == dtype


def head_and_reference(dtype):
    """A linear output head over hidden states, and a copy of it for the reference."""
    torch.manual_seed(5)
    hidden = torch.randn(4, 6, 16)
    weight = (torch.randn(24, 16) * 0.5).to(dtype).requires_grad_()
    ref_weight = weight.detach().float().requires_grad_()
    return hidden, weight, ref_weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_consumed_logits_give_torch_cross_entropy_and_its_gradient(dtype, chunked):
    """With `consume_logits` the head's output is overwritten, and the loss and the head's
    weight gradient are still `F.cross_entropy`'s over the 17 token columns of 24."""
    hidden, weight, ref_weight = head_and_reference(dtype)
    target = torch.randint(0, 17, (4, 6))
    logits = hidden.to(dtype) @ weight.t()
    loss = vocab_parallel_cross_entropy(logits, target, vocab_size=17, consume_logits=True)
    ref = F.cross_entropy(
        (hidden @ ref_weight.t())[..., :17].reshape(-1, 17), target.view(-1), reduction="none"
    ).view(4, 6)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(loss, ref, **tol)
    up = torch.rand(4, 6)
    (loss * up).sum().backward()
    (ref * up).sum().backward()
    torch.testing.assert_close(weight.grad.float(), ref_weight.grad, **tol)


def test_an_earlier_reader_of_consumed_logits_fails_loudly():
    """Another op that saved the logits for its backward before the loss sees them
    overwritten: autograd refuses, rather than computing a wrong gradient."""
    hidden, weight, _ = head_and_reference(torch.float32)
    logits = hidden @ weight.t()
    other = (logits * logits).sum()  # saves the logits
    loss = vocab_parallel_cross_entropy(logits, torch.zeros(4, 6, dtype=torch.long), None, 0.0,
                                        consume_logits=True)  # fmt: skip
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (loss.sum() + other).backward()


@pytest.mark.parametrize("fused", [False, True], ids=["passes", "fused passes"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_consumed_logits_need_no_logits_sized_buffer(dtype, fused, monkeypatch):
    tokens, vocab, padded = 64, 500, 512
    monkeypatch.setitem(cross_entropy.CHUNK_BYTES, "cpu", 8 * padded * 4)
    if fused:
        monkeypatch.setattr(cross_entropy, "FUSED_PASSES", FORCED_FUSED)
    weight = torch.randn(padded, 8).to(dtype).requires_grad_()
    hidden = torch.randn(4, tokens // 4, 8).to(dtype)
    target = torch.randint(0, vocab, (4, tokens // 4))
    logits = hidden @ weight.t()
    with NewLargeTensors(tokens * vocab // 2) as counted:
        loss = vocab_parallel_cross_entropy(logits, target, vocab_size=vocab, consume_logits=True)
        loss.sum().backward()
    assert counted.ops == [], counted.ops


@pytest.mark.parametrize("fused", [False, True], ids=["passes", "fused passes"])
def test_bf16_forward_and_backward_read_nothing_back_from_the_device(fused, monkeypatch):
    """Neither path makes the host wait for the device (HostReads: .item(), nonzero, mask
    indexing, ...), over logits several chunks long with label smoothing and padding."""
    from tests.device_costs import HostReads

    monkeypatch.setitem(cross_entropy.CHUNK_BYTES, "cpu", 3 * 24 * 4)
    if fused:  # a GPU's path for bf16 logits (FUSED_PASSES)
        monkeypatch.setattr(cross_entropy, "FUSED_PASSES", FORCED_FUSED)
    logits = (torch.randn(4, 5, 24) * 3).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, 17, (4, 5))
    with HostReads() as reads:
        loss = vocab_parallel_cross_entropy(logits, target, label_smoothing=0.1, vocab_size=17)
        loss.sum().backward()
    assert reads.count == 0, reads.where


def test_a_later_reader_of_consumed_logits_fails_loudly():
    """An op after the loss that reads the consumed logits reads the softmax, and the gradient
    through it would be lost: the backward refuses, naming the cause."""
    hidden, weight, _ = head_and_reference(torch.float32)
    logits = hidden @ weight.t()
    loss = vocab_parallel_cross_entropy(logits, torch.zeros(4, 6, dtype=torch.long), None, 0.0,
                                        consume_logits=True)  # fmt: skip
    later = logits.square().sum()  # after the loss: a z-loss written after it, say
    with pytest.raises(RuntimeError, match="consumed the logits"):
        (loss.sum() + later).backward()
    logits = hidden @ weight.t()
    loss = vocab_parallel_cross_entropy(logits, torch.zeros(4, 6, dtype=torch.long), None, 0.0,
                                        consume_logits=True)  # fmt: skip
    with pytest.raises(RuntimeError, match="consumed the logits"):
        logits.sum().backward()  # the later reader alone
