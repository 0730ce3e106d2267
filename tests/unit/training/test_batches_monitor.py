"""Samples → model inputs (loss mask, labels, positions); interval figures; evaluation."""

from __future__ import annotations

import io
import math

import pytest
import torch

from megatron.training.loop.evaluation import Evaluator, evaluate
from megatron.training.metrics.monitor import TrainMonitor
from megatron.training.setup.batches import (
    BatchSettings,
    ModelBatches,
    reset_positions,
    to_model_inputs,
)

EOD = 0


def test_shifted_tokens_labels_and_plain_positions():
    text = torch.tensor([[5, 6, 0, 7, 8]])
    (tokens, positions), (labels, mask) = to_model_inputs({"text": text}, BatchSettings(EOD))
    assert tokens.tolist() == [[5, 6, 0, 7]]
    assert labels.tolist() == [[6, 0, 7, 8]]
    assert mask.tolist() == [[1.0, 1.0, 1.0, 1.0]]
    assert positions.tolist() == [[0, 1, 2, 3]]


def test_eod_mask_and_reset_positions():
    text = torch.tensor([[5, 0, 6, 7, 0, 8, 9], [0, 1, 2, 3, 4, 5, 6]])
    settings = BatchSettings(EOD, eod_mask_loss=True, reset_position_ids=True)
    (tokens, positions), (_, mask) = to_model_inputs({"text": text}, settings)
    assert mask.tolist() == [[1, 0, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1]]
    assert positions.tolist() == [[0, 1, 0, 1, 2, 0], [0, 0, 1, 2, 3, 4]]
    assert reset_positions(torch.tensor([[1, 2, 3]]), EOD).tolist() == [[0, 1, 2]]


def test_label_data_masks_negative_labels():
    sample = {"text": torch.tensor([[1, 2, 3, 4]]), "label": torch.tensor([[9, -100, 7, -100]])}
    _, (labels, mask) = to_model_inputs(sample, BatchSettings(EOD))
    assert labels.tolist() == [[0, 7, 0]] and mask.tolist() == [[0.0, 1.0, 0.0]]


def test_settings_errors(make_config):
    with pytest.raises(ValueError, match="end-of-document"):
        BatchSettings(None, eod_mask_loss=True)
    with pytest.raises(ValueError, match="reset_attention_mask"):
        BatchSettings.from_config(make_config(reset_attention_mask=True), EOD)
    settings = BatchSettings.from_config(make_config(eod_mask_loss=True), EOD)
    assert settings.eod_mask_loss and not settings.reset_position_ids


def test_model_batches_counts():
    samples = iter([{"text": torch.ones(2, 5, dtype=torch.long)}] * 3)
    batches = ModelBatches(samples, BatchSettings(EOD))
    next(batches), next(batches)
    assert batches.taken == 2


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_monitor_interval_figures():
    clock = _Clock()
    monitor = TrainMonitor(1000, 2e9, world_size=2, peak_tflops=4.0, train_iters=10, clock=clock)
    monitor.step(3.0, applied=True)
    monitor.step(9.0, applied=False)  # a skipped step's loss does not count
    monitor.step(5.0, applied=True)
    clock.now += 2.0
    record = monitor.record(3, lr=1e-3, grad_norm=0.5, loss_scale=None, timers={"fwd": 1.5})
    assert record["loss"] == 4.0 and record["skipped"] == 1
    assert record["tokens_per_sec"] == 1500.0
    assert record["tflops_per_gpu"] == pytest.approx(1500 * 2e9 / 2 / 1e12)
    assert record["mfu"] == pytest.approx(record["tflops_per_gpu"] / 4.0)
    assert record["eta_s"] == pytest.approx(7 * 2.0 / 3)
    assert record["elapsed_s"] == 2.0 and record["time/fwd"] == 1.5
    clock.now += 1.0
    monitor.step(2.0, applied=True)
    assert monitor.record(4, 1e-3, None, None)["tokens_per_sec"] == 1000.0


def test_monitor_shows_a_non_finite_loss():
    monitor = TrainMonitor(1000, 2e9, world_size=1, peak_tflops=None, train_iters=10)
    monitor.step(3.0, applied=True)
    monitor.step(float("nan"), applied=False)  # skipped: inf/NaN loss
    record = monitor.record(2, lr=1e-3, grad_norm=float("inf"), loss_scale=None)
    assert math.isnan(record["loss"]) and record["skipped"] == 1
    monitor.step(float("inf"), applied=False)
    assert monitor.record(3, 1e-3, None, None)["loss"] == math.inf
    for loss in (7.0, 9.0):  # fp16: every step overflowed, the losses themselves are finite
        monitor.step(loss, applied=False)
    assert monitor.record(5, 1e-3, None, 1.0)["loss"] == 8.0


class _Steps:
    def __init__(self, losses):
        self.losses = iter(losses)

    def eval_step(self, batches):
        next(batches)
        return next(self.losses)


class _Loggers:
    def __init__(self):
        self.records = []

    def log_eval(self, record):
        self.records.append(record)


def test_evaluate_and_evaluator():
    result = evaluate(_Steps([2.0, 4.0]), iter(range(10)), eval_iters=2)
    assert result.loss == 3.0 and result.perplexity == pytest.approx(math.exp(3.0))
    loggers = _Loggers()
    evaluator = Evaluator(_Steps([1.0, 2.0]), iter(range(10)), 5, 1, loggers)
    assert [evaluator.due(i) for i in (4, 5, 10)] == [False, True, True]
    evaluator.run(5)
    evaluator.run(6, "test", iter(range(3)))
    assert [(r["split"], r["loss"]) for r in loggers.records] == [("valid", 1.0), ("test", 2.0)]
    assert evaluator.last.loss == 1.0
    assert evaluator.run(7, "test", None) is None  # no test split


def test_only_the_language_model_objective_reports_a_perplexity(make_config):
    from megatron.training.metrics.loggers.console import ConsoleLogger
    from megatron.training.objectives import OBJECTIVES

    cfg = make_config(
        train_impl="dpo", dataset_impl="pairwise", pack_impl="unpacked",
        pos_train_data_paths=["p"], neg_train_data_paths=["n"],
    )  # fmt: skip
    steps = _Steps([0.5, 0.7])
    steps.objective = OBJECTIVES["dpo"](cfg)
    steps.take_metrics = lambda: {"reward_acc": 0.75}
    result = evaluate(steps, iter(range(10)), eval_iters=2)
    assert result.loss == pytest.approx(0.6) and result.perplexity is None
    record = result.record(10, "valid")
    assert "perplexity" not in record and record["reward_acc"] == 0.75
    out = io.StringIO()
    ConsoleLogger(stream=out).log_eval(record)
    assert out.getvalue() == "valid at iteration 10 | loss 0.6000 | reward_acc 0.7500\n"
