"""Distro on gloo ranks.

1. Two ranks with different gradients end where the paper's algorithm, written out in numpy
   (`tests/unit/training/test_distro.py::reference_steps`), puts both: the exchanged
   coefficients of both ranks are averaged, and the replicas stay equal bit for bit.
2. `pretrain` with data parallelism (2 ranks: dp 2 on the pipeline engine; 4 ranks: tp 2 × dp 2
   on the plain engine, pp 2 × dp 2): the engine's gradient all-reduce is off, the replicas of
   each shard hold identical weights, and a run stopped at step 3 and resumed repeats the
   unbroken run bit for bit (the per-rank momenta come back from the checkpoint).
"""

from __future__ import annotations

import hashlib
import importlib

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings
from tests.unit.training.test_distro import assert_matches_reference, reference_steps

SETTINGS = dict(lr=0.01, wd=0.1, decay=0.9, chunk=4, topk=3, one_bit=True)
SHAPES = [(8, 12), (12,)]
STEPS = 3


def _grads(rank, shape):
    gen = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(shape, dtype=torch.float64, generator=gen) for _ in range(STEPS)]


def _raw_steps(rank, world_size):
    from megatron.training.optim import Distro

    params = [
        torch.nn.Parameter(
            torch.randn(s, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        )  # fmt: skip
        for i, s in enumerate(SHAPES)
    ]
    opt = Distro(
        [{"params": params, "weight_decay": SETTINGS["wd"]}],
        lr=SETTINGS["lr"],
        compression_decay=SETTINGS["decay"],
        compression_chunk=SETTINGS["chunk"],
        compression_topk=SETTINGS["topk"],
        group=dist.group.WORLD,
    )
    grads = [_grads(rank, s) for s in SHAPES]
    for t in range(STEPS):
        for p, g in zip(params, grads):
            p.grad = g[t].clone()
        opt.step()
    return [p.detach().numpy() for p in params]


def test_two_ranks_average_their_fast_components_as_the_paper_says():
    ranks = run_distributed(_raw_steps, 2, timeout=900)
    for i, shape in enumerate(SHAPES):
        assert np.array_equal(ranks[0][i], ranks[1][i])  # replicas equal bit for bit
        init = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        grads = [[g.numpy() for g in _grads(r, shape)] for r in range(2)]
        expected, tied = reference_steps(init.numpy(), grads, **SETTINGS)
        assert_matches_reference(ranks[0][i], expected, tied, SETTINGS["lr"], STEPS)


DISTRO = {"type": "Distro", "params": {"lr": 2.0e-3, "compression_chunk": 16}}


def _pretrain_runs(rank, world_size, runs):
    # the module (the package exports a function of the same name)
    pretrain_module = importlib.import_module("megatron.training.pretrain")

    built = []
    real_build = pretrain_module.build_engine

    def recording_build(cfg, topology, *args, **kwargs):  # the real one, remembered
        parts = real_build(cfg, topology, *args, **kwargs)
        built.append((parts, topology))
        return parts

    pretrain_module.build_engine = recording_build
    out = []
    for settings in runs:
        result = pretrain_module.pretrain(resolve(settings, world_size))
        parts, topology = built[-1]
        engine = parts.engine
        digest = hashlib.sha256()
        for p in parts.model.parameters():
            digest.update(p.detach().contiguous().numpy().tobytes())
        out.append(
            {
                "losses": result.losses,
                "valid": result.valid.loss if result.valid else None,
                "stopped": result.stopped,
                "shard": (topology.tp_rank, topology.pp_rank),
                "weights": digest.hexdigest(),
                "allreduce": engine.enable_backward_allreduce
                or getattr(engine, "pipeline_enable_backward_allreduce", False),
            }
        )
    return out


def _stop_and_resume(folder, **layout):
    unbroken = tiny_settings(folder / "unbroken", optimizer=DISTRO, **layout)
    stopped = tiny_settings(folder / "broken", optimizer=DISTRO, exit_interval=3, **layout)
    resumed = tiny_settings(folder / "broken", optimizer=DISTRO, **layout)
    return [unbroken, stopped, resumed]


def _check(per_rank, first_run: int, name: str):
    """Run `first_run` (unbroken), +1 (stopped at 3), +2 (resumed) of every rank."""
    unbroken, stopped, resumed = per_rank[0][first_run : first_run + 3]
    assert stopped["stopped"] and stopped["losses"] == unbroken["losses"][:3], name
    assert resumed["losses"] == unbroken["losses"][3:], name  # bitwise
    assert resumed["valid"] == unbroken["valid"], name
    assert unbroken["losses"][-1] < unbroken["losses"][0], name
    _check_replicas(per_rank, first_run, name)
    _check_replicas(per_rank, first_run + 2, name)


def _check_replicas(per_rank, run: int, name: str):
    by_shard: dict[tuple, set] = {}
    for rank in per_rank:
        assert rank[run]["allreduce"] is False, name
        by_shard.setdefault(rank[run]["shard"], set()).add(rank[run]["weights"])
    assert all(len(w) == 1 for w in by_shard.values()), name  # dp replicas identical


@pytest.mark.slow
def test_dp2_pipeline_engine_keeps_replicas_equal_and_resumes_exactly(tmp_path):
    runs = _stop_and_resume(tmp_path / "dp2", pipe_parallel_size=1)
    _check(run_distributed(_pretrain_runs, 2, runs, timeout=1200), 0, "pp1_dp2")


@pytest.mark.slow
def test_tp2_dp2_and_pp2_dp2_keep_replicas_equal_and_resume_exactly(tmp_path):
    tp_dp = dict(pipe_parallel_size=0, model_parallel_size=2)
    pp_dp = dict(pipe_parallel_size=2, model_parallel_size=1)
    runs = _stop_and_resume(tmp_path / "tp2_dp2", **tp_dp)
    runs.append(
        tiny_settings(tmp_path / "pp2_dp2", optimizer=DISTRO, save=None, load=None, **pp_dp)
    )
    per_rank = run_distributed(_pretrain_runs, 4, runs, timeout=1200)
    _check(per_rank, 0, "tp2_dp2")
    _check_replicas(per_rank, 3, "pp2_dp2")
    assert per_rank[0][3]["losses"][-1] < per_rank[0][3]["losses"][0]
