"""A step whose loss is inf/NaN leaves weights, optimizer state and LR schedule untouched, on
real DeepSpeed engines over two gloo ranks: the pipeline engine over two stages (the first
stage has no loss, only gradients) and the plain engine over two data-parallel ranks, in fp32
(our optimizer without any DeepSpeed wrapper) and bf16 (DeepSpeed's bf16 optimizers).

The divergence is real: one step at learning rate 1e30 blows the weights up to ~1e30 (finite),
and the next forward pass overflows (inf/NaN loss). A finite but absurd state is also never
reported as non-finite, and a state holding inf is (what `CheckpointCallback` asks before each
save)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

VARIANTS = {
    "fp32_pipeline_pp2": dict(pipe_parallel_size=2),
    "fp32_plain_dp2": dict(pipe_parallel_size=0),
    "bf16_pipeline_pp2": dict(pipe_parallel_size=2, precision="bfloat16"),
    "bf16_plain_dp2": dict(pipe_parallel_size=0, precision="bfloat16"),
}


def _snapshot(parts) -> dict:
    """Every weight (module and fp32 master), optimizer state tensor and the LR schedule."""
    engine, optimizer = parts.engine, parts.optimizer
    out = {f"module.{n}": p.detach().clone() for n, p in engine.module.named_parameters()}
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            out[f"master.{g}.{i}"] = p.detach().clone()
            for key, value in optimizer.state.get(p, {}).items():
                out[f"state.{g}.{i}.{key}"] = torch.as_tensor(value).detach().clone()
    out["lr"] = torch.tensor([group["lr"] for group in optimizer.param_groups])
    out["lr_scheduler"] = torch.tensor(parts.lr_scheduler.state_dict()["num_iters"])
    return out


def _same(a: dict, b: dict) -> list[str]:
    """Names whose tensors differ (NaN-aware, bitwise otherwise)."""
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


def _diverge(rank, world_size, folder):
    from megatron.data import build_tokenizer
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.batches import BatchSettings
    from megatron.training.setup.data import BatchFactory, build_datasets
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.nonfinite import NonFiniteSteps, state_is_finite
    from megatron.training.step.steps import engine_steps

    results = {}
    for name, variant in VARIANTS.items():
        settings = tiny_settings(
            f"{folder}/{name}", save=None, load=None, train_iters=4, hidden_dropout=0.0,
            attention_dropout=0.0, num_gpus=world_size, **variant,
        )  # fmt: skip
        cfg = resolve(settings, world_size)
        topology = initialize_distributed(cfg)
        seed_everything(cfg.training.seed)
        tokenizer = build_tokenizer(cfg)
        parts = build_engine(cfg, topology, 4)
        engine = parts.engine
        steps = engine_steps(engine, topology)
        NonFiniteSteps(engine, parts.optimizer, topology, steps.local_loss).install()
        settings = BatchSettings.from_config(cfg, tokenizer.eod)
        batches = BatchFactory(cfg, topology, settings, engine.device)(build_datasets(cfg, 4)[0], 0)
        first = steps.train_step(batches)
        for group in parts.optimizer.param_groups:
            group["lr"] = 1.0e30  # one absurd step: weights ~1e30, still finite
        steps.train_step(batches)
        blown_up_applied = steps.step_applied
        finite_before = state_is_finite(engine, parts.optimizer)
        before = _snapshot(parts)
        skipped_losses, applied = [], []
        for _ in range(2):
            skipped_losses.append(steps.train_step(batches))
            applied.append(steps.step_applied)
        changed = _same(before, _snapshot(parts))
        param = next(engine.module.parameters())
        param.data.view(-1)[0] = float("inf")  # the state a checkpoint must never hold
        results[name] = dict(
            first=first,
            blown_up_applied=blown_up_applied,
            finite_before=finite_before,
            finite_with_inf=state_is_finite(engine, parts.optimizer),
            skipped_losses=skipped_losses,
            applied=applied,
            changed=changed,
            skipped_steps=engine.skipped_steps,
        )
    return results


def test_skipped_step_leaves_weights_optimizer_and_schedule_untouched(tmp_path):
    by_rank = run_distributed(_diverge, 2, str(tmp_path), timeout=600)
    for name in VARIANTS:  # every rank took the same decisions
        assert by_rank[0][name]["applied"] == by_rank[1][name]["applied"], name
    for rank, results in enumerate(by_rank):
        for name, r in results.items():
            where = f"{name} rank {rank}"
            assert math.isfinite(r["first"]) and r["blown_up_applied"], where
            assert r["finite_before"], where  # ~1e30 is absurd but finite
            assert not any(math.isfinite(x) for x in r["skipped_losses"]), (where, r)
            assert r["applied"] == [False, False], where
            assert r["changed"] == [], (where, r["changed"][:5])
            assert r["skipped_steps"] == 2, where
            assert r["finite_with_inf"] is False, where
