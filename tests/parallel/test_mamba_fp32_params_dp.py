"""Mamba's fp32 `A_log` and `D` in fp16/bf16 runs over two data-parallel ranks (gloo): their
gradients are reduced in fp32 on every wrapper (`megatron/training/step/fp32_params.py`).

Each rank trains on its own batch. At every step, the fp32 gradient each rank's torch optimizer
gets for A_log and D (its partition of the flat group under ZeRO and `BF16_Optimizer`, the
whole tensors under `FP16_UnfusedOptimizer`) equals the average over the ranks of autograd's
fp32 gradients (hooked on the parameters, all-reduced here in fp32) times the loss scale's
inverse, to fp32 precision; a reduction in bf16 or fp16 (DeepSpeed's communication dtype) would
be 1e-3 off. The ranks hold the same A_log and D, fp32, after the steps. The fp16 ZeRO 1 case
has GPT-NeoX's Mamba files' ZeRO section (overlap_comm, reduce_scatter, contiguous_gradients).
"""

from __future__ import annotations

import pytest

from tests.distributed import run_distributed

pytestmark = pytest.mark.slow

STEPS = 3
FP16 = {"loss_scale": 0, "initial_scale_power": 8}
NEOX_ZERO1 = {"stage": 1, "allgather_partitions": True, "allgather_bucket_size": 500000000,
              "overlap_comm": True, "reduce_scatter": True, "reduce_bucket_size": 500000000,
              "contiguous_gradients": True}  # fmt: skip
LAYOUTS = {
    "bf16_zero0": dict(precision="bfloat16", zero_optimization={"stage": 0}),
    "bf16_zero1": dict(precision="bfloat16", zero_optimization={"stage": 1}),
    "bf16_zero2": dict(precision="bfloat16", zero_optimization={"stage": 2}),
    "fp16_zero0": dict(fp16=FP16, zero_optimization={"stage": 0}),
    "fp16_zero1_neox": dict(fp16=FP16, zero_optimization=NEOX_ZERO1),
}


def _engine(folder, layout, world_size):
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.engine import build_engine
    from tests.tiny import resolve, tiny_settings

    settings = tiny_settings(folder, hidden_dropout=0.0, attention_dropout=0.0, save=None,
                             load=None, checkpoint_factor=None, pipe_parallel_size=0,
                             attention_config=[[["mamba"], 2]], norm="rmsnorm", pos_emb="none",
                             gradient_clipping=0.0)  # fmt: skip
    cfg = resolve({**settings, **LAYOUTS[layout]}, world_size)
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    return build_engine(cfg, topology, cfg.training.train_iters), topology


def _batches(rank, n):
    import torch

    g = torch.Generator().manual_seed(rank)
    tokens, labels = torch.randint(0, 60, (2, 2, 32), generator=g)
    batch = ((tokens, torch.arange(32).expand(2, 32)), (labels, torch.ones(2, 32)))
    return iter([batch] * n)


def _train(rank, world_size, folder, layout):
    import torch
    import torch.distributed as dist

    from megatron.training.step.steps import engine_steps

    parts, topology = _engine(folder, layout, world_size)
    marked = [p for n, p in parts.engine.module.named_parameters() if n.endswith(("A_log", ".D"))]
    summed = [torch.zeros_like(p) for p in marked]

    def add(i, grad) -> None:  # None: the hook leaves the gradient as it is
        summed[i].add_(grad.float())

    for i, p in enumerate(marked):
        p.register_hook(lambda grad, i=i: add(i, grad))
    optimizer, step, seen = parts.optimizer, parts.optimizer.step, []

    def record_step(*args, **kwargs):
        groups = [g for g in optimizer.param_groups if g["name"] == "no_decay_fp32"]
        if groups:  # ZeRO steps one group at a time
            grads = torch.cat([m.grad.reshape(-1) for m in groups[0]["params"]])
            seen.append((grads.clone(), torch.cat([s.reshape(-1) for s in summed])))
            for s in summed:
                s.zero_()
        return step(*args, **kwargs)

    optimizer.step = record_step
    steps = engine_steps(parts.engine, topology)
    losses = [float(steps.train_step(_batches(rank, 2))) for _ in range(STEPS)]
    residuals, scales = [], []
    for grad, autograd in seen:
        dist.all_reduce(autograd)  # fp32, gloo
        want = autograd / world_size
        if grad.numel() != want.numel():  # this rank's partition of the padded flat group
            padded = torch.zeros(grad.numel() * world_size)
            padded[: want.numel()] = want
            want = padded.view(world_size, -1)[rank]
        scale = float(grad @ want / (want @ want))
        residuals.append(float((grad - scale * want).norm() / grad.norm()))
        scales.append(scale)
    flat = torch.cat([p.detach().reshape(-1) for p in marked])
    gathered = [torch.zeros_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    return {
        "losses": losses,
        "steps": len(seen),
        "dtypes": {str(p.dtype) for p in marked},
        "residuals": residuals,
        "scales": scales,
        "ranks_agree": all(torch.equal(gathered[0], g) for g in gathered),
        "wrapper": type(parts.engine.optimizer).__name__,
    }


def _every_layout(rank, world_size, folder):
    from pathlib import Path

    from deepspeed.accelerator import get_accelerator

    type(get_accelerator()).is_fp16_supported = lambda self: True  # as test_fp16_engine_scaling
    return {layout: _train(rank, world_size, Path(folder) / layout, layout) for layout in LAYOUTS}


def test_fp32_gradients_are_reduced_in_fp32_over_data_parallel_ranks(tmp_path):
    results = run_distributed(_every_layout, 2, str(tmp_path), timeout=900)
    for layout in LAYOUTS:
        unscale = 1.0 if layout.startswith("bf16") else 2.0 ** -FP16["initial_scale_power"]
        for rank, by_layout in enumerate(results):
            r = by_layout[layout]
            assert r["steps"] == STEPS and r["dtypes"] == {"torch.float32"}, (layout, rank)
            assert max(r["residuals"]) < 1e-5, (layout, rank, r["residuals"], r["wrapper"])
            assert r["scales"] == pytest.approx([unscale] * STEPS, rel=1e-5), (layout, rank)
            assert r["ranks_agree"], (layout, rank)
            assert all(x == x for x in r["losses"]), (layout, rank)
