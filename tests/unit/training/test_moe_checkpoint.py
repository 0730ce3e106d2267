"""Expert slices in checkpoints (`megatron/checkpoint/experts.py`), without processes.

A rank's layout is a `ParallelTopology` given its world size and rank (no groups needed):
expert-parallel rank 1 writes its experts and their AdamW state once, the reader's merge
puts the slices back together into the experts of the same layer built whole (ep = 1), and
a load restores a rank's slice and optimizer state exactly.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from megatron.checkpoint.experts import expert_file, expert_slices, merge_expert_slices
from megatron.model.moe import Experts
from megatron.parallel import ParallelTopology
from megatron.training.checkpoint.experts import ExpertCheckpoint
from tests.unit.model.tiny import neox_args

ARGS = neox_args(moe_num_experts=4, moe_top_k=2, moe_router_type="topk")


def _model(ep: int, ep_rank: int) -> nn.Module:
    """`2.mlp.experts.*` as the model names them, holding expert-parallel rank ep_rank's."""
    layer, mlp = nn.Module(), nn.Module()
    torch.manual_seed(ARGS.seed)  # the layer's seed, as `specs.py` sets it: same full weights
    mlp.experts = Experts(ARGS, ep, ep_rank)
    layer.mlp = mlp
    root = nn.Module()
    root.add_module("2", layer)
    return root


def _trained(model: nn.Module) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    sum(p.square().sum() for p in model.parameters()).backward()
    optimizer.step()
    return optimizer


def _topology(rank: int, world: int = 4, tp: int = 1) -> ParallelTopology:
    return ParallelTopology(tp_size=tp, pp_size=1, world_size=world, rank=rank, ep_size=2)


def test_each_slice_is_written_once_by_its_first_replica(tmp_path):
    model = _model(2, 1)
    optimizer = _trained(model)
    for rank in range(4):  # dp 4, ep 2: ranks 1 and 3 hold expert-parallel rank 1's experts
        ExpertCheckpoint(model, optimizer, _topology(rank)).save(tmp_path, True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["expert_states_pp0_ep1.pt"]
    tp_pair = tmp_path / "tp"
    tp_pair.mkdir()
    for rank in (2, 3):  # tp 2, dp 2: rank 2 is dp 1 / tp 0, rank 3 its tp-1 twin
        ExpertCheckpoint(model, optimizer, _topology(rank, tp=2)).save(tp_pair, True)
    assert [p.name for p in tp_pair.iterdir()] == ["expert_states_pp0_ep1.pt"]


def test_the_reader_merge_gives_the_experts_built_whole(tmp_path):
    whole, first, second = _model(1, 0), _model(2, 0), _model(2, 1)
    ExpertCheckpoint(second, None, _topology(1)).save(tmp_path, False)
    from_deepspeed = {n: p.detach() for n, p in first.named_parameters()}
    merged = merge_expert_slices(from_deepspeed, expert_slices(tmp_path, 2))
    for name, p in whole.named_parameters():
        assert torch.equal(merged[name], p.detach()), name


def test_a_missing_slice_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"expert_states_pp\*_ep1.pt"):
        expert_slices(tmp_path, 2)


def test_load_restores_the_slice_and_its_optimizer_state(tmp_path):
    saved_model = _model(2, 1)
    saved_optimizer = _trained(saved_model)
    (tmp_path / "config.json").write_text(json.dumps({"moe_expert_parallel_size": 2}))
    ExpertCheckpoint(saved_model, saved_optimizer, _topology(1)).save(tmp_path, True)
    assert expert_file(tmp_path, 0, 1).is_file()

    model = _model(2, 0)  # other values: rank 0's experts, as DeepSpeed's load leaves them
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    experts = ExpertCheckpoint(model, optimizer, _topology(3))  # dp 3: ep rank 1, replica 1
    experts.check(tmp_path)
    experts.load(tmp_path, True)
    for (name, p), q in zip(model.named_parameters(), saved_model.parameters(), strict=True):
        assert torch.equal(p, q), name
        for key, value in saved_optimizer.state[q].items():
            assert torch.equal(optimizer.state[p][key], value), f"{name} {key}"
