"""`ParallelTopology` groups equal DeepSpeed's grid, and DeepSpeed's engine accepts it as `mpu`.

One spawn of 4 gloo ranks:
1. for every dp x pp x tp layout of 4 ranks, each of our groups really connects the ranks of
   DeepSpeed's `PipelineParallelGrid` built from `topology.ds_topology` (checked by an
   all-reduce, not only by the stored rank lists), and the mpu methods agree with the grid's;
2. `deepspeed.initialize(mpu=topology)` at tp=2, dp=2 (ZeRO 0, 2 and 3, gradient clipping on):
   one step equals SGD on the unsharded twin with the dp-averaged, globally clipped gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.parallel import (
    ColumnParallelLinear,
    ParallelTopology,
    RowParallelLinear,
    gather_full_parameter,
)
from tests.distributed import run_distributed

LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4)]  # (tp, pp) for 4 ranks


def members(group) -> list[int]:
    """The ranks `group` really connects: all-reduce of one-hot rank vectors."""
    onehot = torch.zeros(dist.get_world_size())
    onehot[dist.get_rank()] = 1.0
    dist.all_reduce(onehot, group=group)
    return onehot.nonzero().flatten().tolist()


def check_against_grid(tp, pp):
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid

    topo = ParallelTopology(tp_size=tp, pp_size=pp)
    grid = PipelineParallelGrid(topology=topo.ds_topology)
    assert (topo.pp_rank, topo.dp_rank, topo.tp_rank) == (
        grid.get_stage_id(),
        grid.get_data_parallel_id(),
        grid.get_slice_parallel_rank(),
    )
    assert topo.tp_ranks == members(topo.get_tensor_model_parallel_group()) == grid.slice_group
    assert topo.dp_ranks == members(topo.get_data_parallel_group()) == grid.dp_group
    assert topo.pp_ranks == members(topo.get_pipe_parallel_group()) == grid.pp_group
    assert members(topo.get_model_parallel_group()) == members(grid.get_model_parallel_group())
    for method in (
        "get_data_parallel_rank",
        "get_data_parallel_world_size",
        "get_pipe_parallel_rank",
        "get_pipe_parallel_world_size",
        "get_model_parallel_rank",
        "get_model_parallel_world_size",
        "get_tensor_model_parallel_rank",
        "get_tensor_model_parallel_world_size",
    ):
        assert getattr(topo, method)() == getattr(grid, method)(), method
    assert topo.tp_ranks == list(range(topo.tp_ranks[0], topo.tp_ranks[0] + tp))  # adjacent
    for size, group in ((tp, topo.tp_group), (pp, topo.pp_group), (topo.dp_size, topo.dp_group)):
        assert (group is None) == (size == 1)


def twin_step(model, topo, batches, lr, max_norm):
    """Unsharded reference: dp-averaged grads, global-norm clipping, one SGD step."""
    g = topo.tp_group
    twin = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
    with torch.no_grad():
        for p, ours in zip(twin.parameters(), model.parameters()):
            p.copy_(gather_full_parameter(ours, g))
    loss = sum(twin(x).square().mean() for x in batches) / len(batches)
    loss.backward()
    norm = torch.cat([p.grad.flatten() for p in twin.parameters()]).norm()
    coef = min(1.0, max_norm / (norm.item() + 1e-6))
    assert coef < 0.9, "pick max_norm so that clipping is really exercised"
    with torch.no_grad():
        return [p - lr * coef * p.grad for p in twin.parameters()]


def check_engine(zero_stage):
    import deepspeed

    topo = ParallelTopology(tp_size=2)  # dp = 2
    g = topo.tp_group
    torch.manual_seed(5)
    model = torch.nn.Sequential(
        ColumnParallelLinear(4, 8, tp_group=g), RowParallelLinear(8, 4, tp_group=g)
    )
    batches = [torch.randn(2, 4) + d for d in range(topo.dp_size)]  # one micro-batch per replica
    lr, max_norm = 0.1, 0.05
    expected = twin_step(model, topo, batches, lr, max_norm)
    config = {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "SGD", "params": {"lr": lr}},
        "gradient_clipping": max_norm,
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config, mpu=topo
    )
    assert engine.dp_world_size == 2 and engine.mp_world_size == 2
    loss = engine(batches[topo.dp_rank]).square().mean()
    engine.backward(loss)
    engine.step()
    params = list(model.parameters())
    # ZeRO-3 also partitions each tp shard over dp; gather that back (a no-op below stage 3).
    with deepspeed.zero.GatheredParameters(params, enabled=zero_stage == 3):
        assert params[0].shape == (4, 4) and params[2].shape == (4, 4)  # still tp-sharded
        for p, ref in zip(params, expected):
            full = gather_full_parameter(p, g)
            err = (full - ref).abs().max().item()
            assert err <= 1e-6 * ref.abs().max().item(), f"ZeRO {zero_stage}: step off by {err}"


def _worker(rank, world_size):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    for tp, pp in LAYOUTS:
        check_against_grid(tp, pp)
    for zero_stage in (0, 2, 3):
        check_engine(zero_stage)
    return True


def test_topology_matches_deepspeed_grid_and_works_as_engine_mpu():
    assert run_distributed(_worker, 4) == [True] * 4
