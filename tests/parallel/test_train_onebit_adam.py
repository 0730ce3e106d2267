"""1-bit Adam on 2 gloo ranks: replicas stay identical while the momentum travels as signs."""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.training.optim.onebit_adam import OneBitAdam
from tests.distributed import run_distributed


class _Engine:
    enable_backward_allreduce = True


def _train(rank, world_size):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    x = torch.randn(32, 6, generator=gen)
    y = x @ torch.arange(6.0).unsqueeze(1)
    opt = OneBitAdam(model.parameters(), lr=0.05, freeze_step=20)
    engine = _Engine()
    opt.attach_engine(engine, group=dist.group.WORLD)
    losses = []
    for _ in range(100):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if engine.enable_backward_allreduce:  # what the DeepSpeed engine does in backward
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world_size
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return losses, flat.tolist(), engine.enable_backward_allreduce  # no tensors


def test_onebit_adam_keeps_replicas_identical_and_learns():
    results = run_distributed(_train, 2)
    (losses0, params0, allreduce0), (losses1, params1, _) = results
    assert params0 == params1
    assert allreduce0 is False
    for losses in (losses0, losses1):  # noisy after the freeze, but far below the start
        assert sum(losses[-10:]) / 10 < 0.15 * losses[0]
