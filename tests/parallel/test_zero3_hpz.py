"""Hybrid sharding through ZeRO++ hpZ (`zero_optimization.zero_hpz_partition_size`) on the
engine the trainer builds (`engine_setup.build_engine`, plain engine, ZeRO-3), 4 gloo ranks
with partitions of 2:

- after a forward pass each rank holds a secondary copy of every parameter partitioned over
  its group, {0, 1} or {2, 3}: the slice `[i * n / 2, (i + 1) * n / 2)` of the flattened
  parameter for the rank's place i in the group, so ranks {0, 2} and {1, 3} hold the same
  slices (replicas across the groups) while the primary partition stays over all 4 ranks;
- training losses equal plain ZeRO-3 over the same steps (`pretrain`, what train.py runs)."""

from __future__ import annotations

import shutil

import pytest

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

ZERO3 = {"stage": 3, "stage3_param_persistence_threshold": 0}
HPZ = {**ZERO3, "zero_hpz_partition_size": 2}


def _plain(folder, zero) -> dict:
    return tiny_settings(
        folder,
        pipe_parallel_size=0,
        zero_optimization=zero,
        checkpoint_factor=None,
        save=None,
        load=None,
        gradient_accumulation_steps=1,
    )


def _partitions(rank, world_size, folder):
    import torch
    from deepspeed.runtime.zero.partition_parameters import GatheredParameters
    from deepspeed.utils import groups

    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.engine import build_engine

    cfg = resolve(_plain(folder, HPZ), world_size)
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    engine = build_engine(cfg, topology, cfg.training.train_iters).engine
    tokens = torch.randint(0, 512, (2, cfg.model.seq_length))
    positions = torch.arange(cfg.model.seq_length).expand_as(tokens)
    engine(tokens, positions)  # gathers each layer's weights, then re-partitions them
    params = list(engine.module.named_parameters())
    secondary, primary_numel, slices_match = {}, 0, True
    place = groups._get_zero_param_intra_parallel_rank_in_mygroup()
    with GatheredParameters([p for _, p in params]):
        for name, p in params:
            size = p.ds_secondary_tensor.numel()
            full = torch.nn.functional.pad(p.detach().flatten(), (0, 2 * size - p.numel()))
            expected = full[place * size : (place + 1) * size].to(p.ds_secondary_tensor.dtype)
            slices_match &= torch.equal(p.ds_secondary_tensor, expected)
            secondary[name] = p.ds_secondary_tensor.float().numpy().tobytes()  # picklable
    primary_numel = sum(p.ds_tensor.numel() for _, p in params)
    return {
        "group": groups._get_zero_param_intra_parallel_group_ranks(),
        "slices_match": slices_match,
        "secondary": secondary,
        "secondary_numel": sum(p.ds_secondary_tensor.numel() for _, p in params),
        "primary_numel": primary_numel,
        "full_numel": sum(p.ds_numel for _, p in params),
    }


def test_hpz_partitions_within_groups_and_replicates_across(tmp_path):
    results = run_distributed(_partitions, 4, tmp_path)
    assert [r["group"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert all(r["slices_match"] for r in results)
    full = results[0]["full_numel"]
    for r in results:  # halves over the group, quarters over the world (plus padding)
        assert full / 2 <= r["secondary_numel"] <= full / 2 + 64 * len(r["secondary"])
        assert full / 4 <= r["primary_numel"] <= full / 4 + 64 * len(r["secondary"])

    def same(a, b):
        return a["secondary"] == b["secondary"]

    replicas = {(a, b) for a in range(4) for b in range(a + 1, 4) if same(results[a], results[b])}
    assert replicas == {(0, 2), (1, 3)}
    shutil.rmtree(tmp_path, ignore_errors=True)


def _losses(rank, world_size, settings):
    from megatron.training import pretrain

    return pretrain(resolve(settings, world_size)).losses


def test_hpz_losses_equal_zero3(tmp_path):
    # one process per run, as train.py runs: DeepSpeed keeps the hpZ groups per process
    zero3 = run_distributed(_losses, 4, _plain(tmp_path / "zero3", ZERO3))[0]
    hpz = run_distributed(_losses, 4, _plain(tmp_path / "hpz", HPZ))[0]
    assert len(zero3) == 6
    assert hpz == pytest.approx(zero3, abs=1e-5)
    shutil.rmtree(tmp_path, ignore_errors=True)
