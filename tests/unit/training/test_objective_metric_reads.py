"""The DPO, KTO and RM metrics stay on the device through the micro-batches of a step.

A loss call adds its metric sums without reading anything back (it read one value per
metric per micro-batch, and KTO's class sums selected by boolean-mask indexing, whose output
size is read back); the step's summary reads them all in one transfer. The values are the
means over every sample of the step, checked against formulas written here.
"""

from __future__ import annotations

import pytest
import torch

from megatron.training.objectives import build_objective
from megatron.training.objectives.rm import RewardModel
from megatron.training.setup.batches import BatchSettings
from tests.device_costs import HostReads
from tests.unit.training.test_objectives import (
    KTO_REWARDS,
    _batch,
    _kto_sample,
    _random_logits_cfg,
    _seq_logps,
)
from tests.unit.training.test_rm_objective import objective as reward_model

MICRO_BATCHES = 3
BETA = 0.3


def _micro_batches(loss, inputs):
    """Run `loss` over each `(logits, loss_inputs)`, counting host reads."""
    with HostReads() as reads:
        for logits, loss_inputs in inputs:
            loss(logits, loss_inputs)
    return reads


def _summary(objective):
    with HostReads() as reads:
        metrics = objective.summary()
    return metrics, reads


def test_dpo_metrics_read_once_per_step():
    objective = build_objective(_random_logits_cfg(train_impl="dpo", dpo_beta=BETA))
    inputs, chosen, rejected = [], [], []
    for seed in range(MICRO_BATCHES):
        logits, labels, mask = _batch(4, 7, seed=seed)
        ref = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        inputs.append((logits, (labels, mask, ref)))
        r = BETA * (_seq_logps(logits, labels, mask) - ref)
        chosen.append(r[:2]), rejected.append(r[2:])
    reads = _micro_batches(objective.loss, inputs)
    assert reads.count == 0, reads.report()
    metrics, reads = _summary(objective)
    assert reads.count == 1, reads.report()
    chosen, rejected = torch.cat(chosen), torch.cat(rejected)
    assert metrics == pytest.approx(
        {
            "chosen_rewards": chosen.mean().item(),
            "rejected_rewards": rejected.mean().item(),
            "margins": (chosen - rejected).mean().item(),
            "reward_acc": (chosen > rejected).double().mean().item(),
        },
        rel=1e-9,
    )


def test_kto_metrics_read_once_per_step():
    cfg = _random_logits_cfg(train_impl="kto", kto_beta=BETA)
    objective = build_objective(cfg)
    inputs, rewards, totals, kls = [], [], [], []
    for seed in range(MICRO_BATCHES):
        sample = _kto_sample(KTO_REWARDS, seed=seed)
        _, (labels, mask, _, reward) = objective.model_inputs(sample, BatchSettings())
        logits = _batch(6, 5, seed=seed)[0]
        ref = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        inputs.append((logits, (labels, mask, ref, reward)))
        ratio = _seq_logps(logits, labels, mask) - ref
        rewards.append(BETA * ratio)
        totals.append(torch.tensor(KTO_REWARDS).sum(-1))
        kls.append((ratio[:3].clamp(min=0).mean() + ratio[3:].clamp(min=0).mean()) / 2)
    reads = _micro_batches(objective.loss, inputs)
    assert reads.count == 0, reads.report()
    metrics, reads = _summary(objective)
    assert reads.count == 1, reads.report()
    r, total = torch.cat(rewards), torch.cat(totals)
    scale = torch.tensor(KTO_REWARDS, dtype=torch.float64).mean(-1).repeat(MICRO_BATCHES)
    desirable, undesirable = r[total > 0.001].mean(), r[total < -0.001].mean()
    assert metrics == pytest.approx(
        {
            "desirable_rewards": desirable.item(),
            "undesirable_rewards": undesirable.item(),
            "margins": (desirable - undesirable).item(),
            "reward_acc": (scale * r > 0).double().mean().item(),
            "kl": torch.stack(kls).mean().item(),
        },
        rel=1e-9,
    )


def test_rm_metrics_read_once_per_step():
    rm: RewardModel = reward_model(0.0)
    gen = torch.Generator().manual_seed(0)
    inputs, margins, chosen = [], [], []
    for _ in range(MICRO_BATCHES):
        values = torch.randn(4, 5, generator=gen)
        last = torch.randint(0, 5, (4,), generator=gen)  # each row's labelled token
        mask = torch.nn.functional.one_hot(last, 5).float()
        inputs.append((values, (None, mask)))
        rewards = values.gather(1, last[:, None]).squeeze(1).double()
        chosen.append(rewards[:2]), margins.append(rewards[:2] - rewards[2:])
    reads = _micro_batches(rm.loss, inputs)
    assert reads.count == 0, reads.report()
    metrics, reads = _summary(rm)
    assert reads.count == 1, reads.report()
    margin, chosen = torch.cat(margins), torch.cat(chosen)
    assert metrics == pytest.approx(
        {
            "accuracy": (margin > 0).double().mean().item(),
            "margin": margin.mean().item(),
            "pos_values": chosen.mean().item(),
            "neg_values": (chosen - margin).mean().item(),
        },
        rel=1e-6,
    )


ONLY_UNDESIRABLE = [[-1.0] * 5, [0.0] * 5, [-1.0] * 5, [0.0] * 5, [-0.5] * 5, [0.0] * 5]


def _kto_step(objective, token_rewards, seed):
    """One KTO micro-batch through the loss; its `beta * r` and reward sums per row."""
    sample = _kto_sample(token_rewards, seed=seed)
    _, (labels, mask, _, reward) = objective.model_inputs(sample, BatchSettings())
    logits = _batch(6, 5, seed=seed)[0]
    ref = torch.zeros(6, dtype=torch.float64)
    objective.loss(logits.clone(), (labels, mask, ref, reward))  # it consumes its logits
    return BETA * _seq_logps(logits, labels, mask), torch.tensor(token_rewards).sum(-1)


def test_train_steps_keep_kto_metrics_on_the_device_until_the_log():
    """Three steps, the second without a desirable sample: the log reads the metrics with the
    losses in one transfer, each the sum of the steps that had it over the interval's steps,
    and a metric no step had (`neutral`) is left out of the record as before."""
    from megatron.training.metrics.monitor import TrainMonitor

    objective = build_objective(_random_logits_cfg(train_impl="kto", kto_beta=BETA))
    monitor = TrainMonitor(8, 1.0, world_size=1, peak_tflops=None, train_iters=3)
    steps = []
    with HostReads() as stepping:
        for seed, rewards in enumerate([KTO_REWARDS, ONLY_UNDESIRABLE, KTO_REWARDS]):
            steps.append(_kto_step(objective, rewards, seed))
            extras = objective.step_metrics()
            extras["neutral"] = torch.zeros(2, dtype=torch.float64)  # never present
            monitor.step(torch.tensor(1.0), True, extras)
    assert stepping.count == 0, stepping.report()
    desirable, margins = [], []
    for r, total in steps:
        if (total > 0.001).any():
            desirable.append(r[total > 0.001].mean())
            margins.append(desirable[-1] - r[total < -0.001].mean())
    assert len(desirable) == 2
    with HostReads() as logging:
        record = monitor.record(3, lr=1.0, grad_norm=None, loss_scale=None)
    assert logging.count == 1, logging.report()
    assert "neutral" not in record
    assert record["desirable_rewards"] == pytest.approx(sum(desirable).item() / 3, rel=1e-9)
    assert record["margins"] == pytest.approx(sum(margins).item() / 3, rel=1e-9)
