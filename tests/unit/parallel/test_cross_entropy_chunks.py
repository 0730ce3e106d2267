"""The bf16 cross entropy's transient memory is one chunk: each chunk of tokens is upcast into
one reused fp32 scratch chunk (forward and backward), not into a new upcast copy and a new
shifted tensor per chunk (2 GiB at a GPU's 1 GiB chunks). Counted with the chunk size forced
to 8 of 64 rows, so that a per-chunk allocation would show eight times."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron.parallel import cross_entropy, vocab_parallel_cross_entropy
from tests.unit.parallel.test_cross_entropy_single import NewLargeTensors

TOKENS, VOCAB, PADDED, ROWS = 64, 500, 512, 8


def test_bf16_passes_reuse_one_chunk_of_scratch(monkeypatch):
    monkeypatch.setitem(cross_entropy.CHUNK_BYTES, "cpu", ROWS * PADDED * 4)
    torch.manual_seed(0)
    logits = (torch.randn(4, TOKENS // 4, PADDED) * 3).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, VOCAB, (4, TOKENS // 4))
    chunk = ROWS * VOCAB  # the token columns of one chunk
    with NewLargeTensors(chunk) as forward:
        loss = vocab_parallel_cross_entropy(logits, target, vocab_size=VOCAB)
    with NewLargeTensors(chunk) as backward:
        loss.sum().backward()
    assert forward.ops == ["aten.empty.memory_format"], forward.ops  # the scratch
    assert sorted(backward.ops) == ["aten.empty.memory_format", "aten.empty_like.default"], (
        backward.ops  # the scratch, and the gradient (the logits' size, bf16)
    )

    ref_logits = logits.detach().float().requires_grad_()
    ref = F.cross_entropy(
        ref_logits[..., :VOCAB].reshape(-1, VOCAB), target.view(-1), reduction="none"
    )
    torch.testing.assert_close(loss, ref.view(4, -1), rtol=1e-6, atol=1e-6)
    ref.sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad.to(torch.bfloat16))


def test_no_grad_keeps_no_logits_sized_buffer(monkeypatch):
    """Scoring without a backward (inference's log-probs): fp32 logits pass through the same
    one chunk of scratch; nothing of their size is kept for a backward that will not come."""
    monkeypatch.setitem(cross_entropy.CHUNK_BYTES, "cpu", ROWS * PADDED * 4)
    logits = torch.randn(4, TOKENS // 4, PADDED) * 3
    target = torch.randint(0, VOCAB, (4, TOKENS // 4))
    with torch.no_grad(), NewLargeTensors(ROWS * VOCAB) as counted:
        loss = vocab_parallel_cross_entropy(logits, target, vocab_size=VOCAB)
    assert counted.ops == ["aten.empty.memory_format"], counted.ops
    ref = F.cross_entropy(logits[..., :VOCAB].reshape(-1, VOCAB), target.view(-1), reduction="none")
    torch.testing.assert_close(loss, ref.view(4, -1), rtol=1e-6, atol=1e-6)


def test_consumed_fp32_logits_without_grad_need_no_scratch(monkeypatch):
    """The training loss under `no_grad` (evaluation) still consumes fp32 logits: exp(z) goes
    into their memory, no chunk of scratch either."""
    monkeypatch.setitem(cross_entropy.CHUNK_BYTES, "cpu", ROWS * PADDED * 4)
    logits = torch.randn(4, TOKENS // 4, PADDED) * 3
    target = torch.randint(0, VOCAB, (4, TOKENS // 4))
    ref = F.cross_entropy(logits[..., :VOCAB].reshape(-1, VOCAB), target.view(-1), reduction="none")
    with torch.no_grad(), NewLargeTensors(ROWS * VOCAB) as counted:
        loss = vocab_parallel_cross_entropy(logits, target, vocab_size=VOCAB, consume_logits=True)
    assert counted.ops == [], counted.ops
    torch.testing.assert_close(loss, ref.view(4, -1), rtol=1e-6, atol=1e-6)
