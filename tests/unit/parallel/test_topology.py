"""ParallelTopology without processes: rank placement vs DeepSpeed's topology, and errors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

from megatron.parallel import ParallelTopology


def layouts(max_world=8):
    for world in range(1, max_world + 1):
        for tp in range(1, world + 1):
            for pp in range(1, world // tp + 1):
                if world % (tp * pp) == 0:
                    yield world, tp, pp


@pytest.mark.parametrize("world,tp,pp", list(layouts()))
def test_rank_placement_equals_deepspeed_topology(world, tp, pp):
    dp = world // (tp * pp)
    ds = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    for rank in range(world):
        topo = ParallelTopology(tp_size=tp, pp_size=pp, world_size=world, rank=rank)
        assert (topo.dp_size, topo.pp_size, topo.tp_size) == (dp, pp, tp)
        coord = ds.get_coord(rank)
        assert (topo.pp_rank, topo.dp_rank, topo.tp_rank) == (coord.pipe, coord.data, coord.model)
        assert topo.tp_ranks in ds.get_axis_comm_lists("model") or tp == 1
        assert topo.dp_ranks in ds.get_axis_comm_lists("data") or dp == 1
        assert topo.pp_ranks in ds.get_axis_comm_lists("pipe") or pp == 1
        for ranks, size in ((topo.tp_ranks, tp), (topo.dp_ranks, dp), (topo.pp_ranks, pp)):
            assert rank in ranks and len(ranks) == size
        # Tensor-parallel ranks are adjacent global ranks (one node's fast links).
        assert topo.tp_ranks == list(range(rank - topo.tp_rank, rank - topo.tp_rank + tp))
        # DeepSpeed's grid: model-parallel rank = index among the sorted ranks of the replica.
        replica = sorted(ds.get_axis_list(axis="data", idx=topo.dp_rank))
        assert topo.get_model_parallel_rank() == replica.index(rank)
        assert topo.get_model_parallel_world_size() == len(replica)
        assert topo.get_tensor_model_parallel_src_rank() == topo.tp_ranks[0]


def test_docstring_example_world8_tp2_pp2():
    topos = [ParallelTopology(tp_size=2, pp_size=2, world_size=8, rank=r) for r in range(8)]
    assert {tuple(t.tp_ranks) for t in topos} == {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert {tuple(t.dp_ranks) for t in topos} == {(0, 2), (1, 3), (4, 6), (5, 7)}
    assert {tuple(t.pp_ranks) for t in topos} == {(0, 4), (1, 5), (2, 6), (3, 7)}
    assert [t.is_last_stage for t in topos] == [False] * 4 + [True] * 4
    assert "rank 5 -> dp 0, pp 1, tp 1" in repr(topos[5])


def test_defaults_single_process_and_pp0_means_one_stage():
    topo = ParallelTopology()
    assert (topo.world_size, topo.rank, topo.dp_size, topo.pp_size, topo.tp_size) == (1, 0, 1, 1, 1)
    assert topo.tp_group is None and topo.dp_group is None and topo.pp_group is None
    assert ParallelTopology(tp_size=2, pp_size=0, world_size=4).pp_size == 1
    assert ParallelTopology(tp_size=2, pp_size=0, world_size=4).dp_size == 2
    assert ParallelTopology(tp_size=np.int64(2), world_size=np.int64(4)).dp_size == 2


def test_groups_missing_without_torch_distributed():
    topo = ParallelTopology(tp_size=2, world_size=4)
    assert topo.tp_group is None  # layers then run unsharded
    with pytest.raises(RuntimeError, match="torch.distributed was initialised"):
        topo.get_data_parallel_group()


def test_from_config_reads_parallel_group():
    cfg = SimpleNamespace(
        parallel=SimpleNamespace(model_parallel_size=2, pipe_parallel_size=0, world_size=8)
    )
    topo = ParallelTopology.from_config(cfg)
    assert (topo.tp_size, topo.pp_size, topo.dp_size) == (2, 1, 4)
    no_world = SimpleNamespace(
        parallel=SimpleNamespace(model_parallel_size=1, pipe_parallel_size=1)
    )
    assert ParallelTopology.from_config(no_world).world_size == 1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(tp_size=3, world_size=8), r"model_parallel_size \(3\) = 3 does not divide"),
        (dict(tp_size=2, pp_size=2, world_size=6), r"product is one of \[1, 2, 3, 6\]"),
        (dict(tp_size=2), r"world size 1 \(the default without dist\)"),
        (dict(tp_size=0), "model_parallel_size must be an integer >= 1, got 0"),
        (dict(tp_size=2.0, world_size=2), "model_parallel_size must be an integer"),
        (dict(tp_size=True, world_size=2), "model_parallel_size must be an integer"),
        (dict(pp_size=-1), "pipe_parallel_size must be an integer >= 0, got -1"),
        (dict(world_size=0), "world size must be an integer >= 1"),
        (dict(world_size=4, rank=4), r"rank 4 is outside \[0, 4\)"),
    ],
)
def test_bad_sizes_raise_errors_naming_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelTopology(**kwargs)
