"""Model-parallel RNG at tp=2, dp=2: who shares dropout masks, and activation checkpointing.

One spawn of 4 gloo ranks (tensor groups [0,1] [2,3]; data groups [0,2] [1,3]):
1. default-generator draws are equal within a tensor-parallel group and differ across data
   parallel replicas; draws under `tensor_parallel_rng()` differ on every rank;
2. a tensor-parallel block with dropout in both regions gives bitwise-identical output and
   gradients with and without DeepSpeed activation checkpointing (also with partitioned
   activations), and its replicated output stays identical on both tp ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from megatron.parallel import (
    ColumnParallelLinear,
    ParallelTopology,
    RowParallelLinear,
    gather_full_parameter,
    model_parallel_seed,
    tensor_parallel_rng,
)
from tests.distributed import run_distributed


def gathered(t: torch.Tensor, group=None) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def check_mask_sharing(topo):
    model_parallel_seed(1234, topo)
    default = gathered(torch.rand(32))
    with tensor_parallel_rng():
        tp_draw = gathered(torch.rand(32))
    after = gathered(torch.rand(32))  # fork() must leave the default stream where it was
    coords = [(r // 2, r % 2) for r in range(4)]  # (dp_rank, tp_rank) when pp = 1
    for a in range(4):
        for b in range(a + 1, 4):
            same_replica = coords[a][0] == coords[b][0]
            assert torch.equal(default[a], default[b]) == same_replica, (a, b)
            assert torch.equal(after[a], after[b]) == same_replica, (a, b)
            assert not torch.equal(tp_draw[a], tp_draw[b]), (a, b)


class DropoutBlock(torch.nn.Module):
    """column -> dropout in the tp region -> gelu -> row -> dropout in the replicated region."""

    def __init__(self, topo):
        super().__init__()
        self.fc1 = ColumnParallelLinear(8, 16, tp_group=topo.tp_group)
        self.fc2 = RowParallelLinear(16, 8, tp_group=topo.tp_group)

    def forward(self, x):
        h = self.fc1(x)  # (b, s, 16/tp), this rank's columns
        with tensor_parallel_rng():
            h = F.dropout(h, p=0.5, training=True)
        return F.dropout(self.fc2(F.gelu(h)), p=0.5, training=True)  # replicated


def run(block, topo, x, up, checkpointed):
    from deepspeed.runtime.activation_checkpointing import checkpointing

    block.zero_grad(set_to_none=True)
    model_parallel_seed(42, topo)
    x = x.clone().requires_grad_()
    out = checkpointing.checkpoint(block, x) if checkpointed else block(x)
    (out * up).sum().backward()
    grads = [gather_full_parameter(p, topo.tp_group, grad=True) for p in block.parameters()]
    return out.detach(), x.grad, grads


def check_checkpointing(topo):
    from deepspeed.runtime.activation_checkpointing import checkpointing

    torch.manual_seed(3)
    block = DropoutBlock(topo)
    x = torch.randn(4, 3, 8)
    up = torch.randn(4, 3, 8)
    ref_out, ref_dx, ref_grads = run(block, topo, x, up, checkpointed=False)
    assert (ref_out == 0).float().mean() > 0.2, "dropout is not active"
    tp_copies = gathered(ref_out, topo.tp_group)
    assert torch.equal(tp_copies[0], tp_copies[1]), "replicated activations diverged across tp"

    for partition in (False, True):
        checkpointing.configure(topo, partition_activations=partition)
        out, dx, grads = run(block, topo, x, up, checkpointed=True)
        assert torch.equal(out, ref_out), f"partition={partition}: output differs"
        assert torch.equal(dx, ref_dx), f"partition={partition}: input grad differs"
        for got, want in zip(grads, ref_grads):
            assert torch.equal(got, want), f"partition={partition}: weight grad differs"


def _worker(rank, world_size):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")  # checkpointing.configure uses ds comm
    topo = ParallelTopology(tp_size=2)
    check_mask_sharing(topo)
    check_checkpointing(topo)
    return True


def test_rng_sharing_and_checkpointed_dropout_at_tp2_dp2():
    assert run_distributed(_worker, 4) == [True] * 4
