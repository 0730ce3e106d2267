"""The z-loss at tp 2 from the cross entropy's logsumexp: the loss and the gathered gradient of
padded vocab-parallel logits equal the fp64 formula on the full logits (masked mean of cross
entropy + z · logsumexp² over the true vocabulary). One spawn of 2 gloo ranks."""

from __future__ import annotations

import torch

from tests.distributed import run_distributed

Z = 0.05


def _worker(rank, world_size):
    from megatron.model.loss import loss_fn
    from megatron.parallel import ParallelTopology, gather_from_tensor_parallel_region

    topo = ParallelTopology(tp_size=2)
    torch.manual_seed(3)  # the same logits, labels and mask on both ranks
    vocab, padded = 13, 16  # the last 3 columns (on rank 1) are padding
    logits = torch.randn(4, 5, padded) * 2 + 3.0
    logits[..., vocab:] += 100.0  # would dominate logsumexp if counted
    labels = torch.randint(0, vocab, (4, 5))
    mask = (torch.rand(4, 5) > 0.3).float()
    local = logits.chunk(2, dim=-1)[topo.tp_rank].clone().requires_grad_()
    loss = loss_fn(local, (labels, mask), tp_group=topo.tp_group, z_loss=Z, vocab_size=vocab)
    loss.backward()
    grad = gather_from_tensor_parallel_region(local.grad, topo.tp_group)

    full = logits.double()[..., :vocab].requires_grad_()
    lse = full.logsumexp(-1)
    ce = lse - full.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ref = ((ce + Z * lse.square()) * mask).sum() / mask.sum()
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-6 * abs(ref.item()), (loss.item(), ref.item())
    torch.testing.assert_close(grad[..., :vocab].double(), full.grad, rtol=1e-5, atol=1e-7)
    assert not grad[..., vocab:].any()
    return True


def test_z_loss_at_tp2_matches_the_fp64_formula():
    assert run_distributed(_worker, 2) == [True, True]
