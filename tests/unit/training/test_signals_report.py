"""SIGTERM/SIGINT are remembered (not fatal) until the loop stops; the start-up report."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from megatron.training.loop.signals import StopRequest
from megatron.training.metrics.flops import StepWork
from megatron.training.metrics.report import final_summary, startup_report


def test_sigterm_is_remembered_and_a_second_sigint_interrupts():
    before = signal.getsignal(signal.SIGTERM)
    stop = StopRequest().install()
    try:
        assert not stop.agreed()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == signal.SIGTERM and stop.agreed()
        os.kill(os.getpid(), signal.SIGINT)  # first SIGINT: remembered
        assert stop.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # second: the user insists
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before


def test_startup_report_has_the_arithmetic(make_config):
    cfg = make_config(gradient_accumulation_steps=2, peak_theoretical_tflops=312)
    topology = SimpleNamespace(world_size=1, dp_size=1, tp_size=1)
    text = startup_report(
        cfg,
        topology,
        parameters=132_864,
        work=StepWork(4, 1, 32, training_flops_per_token=835_584.0),
        train_iters=200,
        dataset_sizes={"train": 3112, "valid": 260, "test": None},
        backend="gloo",
    )
    assert "132,864 parameters (132.86K)" in text
    assert "global 4 = micro 2 × accumulation 2 × data-parallel 1 = 128 tokens per step" in text
    assert "train 3,112 samples, valid 260 samples, test none" in text
    assert "FLOPs per token (model FLOPs): training 835.58K; per step 106.95M;" in text
    assert "MFU against 312 TFLOP/s per device (peak_theoretical_tflops)" in text
    assert "; optimizer Adam; backend gloo\n" in text  # the one in use, whatever the config says
    # the fused head and loss, on by default: 1024 tokens a chunk of the 128-row vocabulary
    assert "vocab 128; head and loss fused, 1024 tokens a chunk (loss_chunk_tokens)\n" in text


def test_startup_report_names_full_logits(make_config):
    text = startup_report(
        make_config(loss_chunk_tokens=0),
        SimpleNamespace(world_size=1, dp_size=1, tp_size=1),
        parameters=1,
        work=StepWork(4, 1, 32, training_flops_per_token=1.0),
        train_iters=2,
        dataset_sizes={"train": 10},
    )
    assert "; full logits (loss_chunk_tokens: 0)\n" in text


def test_a_pairwise_run_with_a_reference_names_the_pairs_and_the_reference_forward(make_config):
    cfg = make_config(gradient_accumulation_steps=2)
    topology = SimpleNamespace(world_size=1, dp_size=1, tp_size=1)
    work = StepWork(4, 2, 32, training_flops_per_token=3e6, reference_flops_per_token=1e6)
    text = startup_report(
        cfg, topology, parameters=1, work=work, train_iters=10, dataset_sizes={"train": 8}
    )
    assert (
        "FLOPs per token (model FLOPs): training 3.00M + reference model forward 1.00M (25% of "
        "the step) = 4.00M; per step 1.02B;" in text  # 4 pairs = 8 sequences = 256 tokens
    )
    assert (
        "global 4 pairs = micro 2 × accumulation 2 × data-parallel 1 = 8 sequences (chosen and "
        "rejected) = 256 tokens per step" in text
    )
    assert "schedule: 10 iterations (2.56K tokens)" in text
    result = SimpleNamespace(iteration=10, stopped=False, losses=[0.5], valid=None, test=None)
    summary = final_summary(
        cfg, result, started_at=4, train_iters=10, seconds=2.0, tokens=6 * work.tokens
    )
    assert "tokens: 1,536 in " in summary and "(768 tokens/s)" in summary


def test_a_resume_names_its_folder_and_a_finished_run_says_it_is_complete(make_config):
    cfg = make_config()
    topology = SimpleNamespace(world_size=1, dp_size=1, tp_size=1)
    text = startup_report(
        cfg, topology, parameters=1, work=StepWork(2, 1, 32, training_flops_per_token=1.0),
        train_iters=10, dataset_sizes={"train": 8}, resumed_from=6,
        resumed_folder="checkpoints/small/global_step6",
    )  # fmt: skip
    assert "  resuming from checkpoints/small/global_step6 at iteration 6" in text
    fresh = startup_report(cfg, topology, parameters=1, work=StepWork(2, 1, 32, 1.0),
                           train_iters=10, dataset_sizes={"train": 8})  # fmt: skip
    assert "resuming from" not in fresh
    done = SimpleNamespace(iteration=10, stopped=False, losses=[], valid=None, test=None)
    summary = final_summary(cfg, done, started_at=10, train_iters=10, seconds=0.0, tokens=0)
    assert "already complete at iteration 10 of 10: nothing to train" in summary
    assert "final loss" not in summary and "tokens: 0" not in summary


@pytest.mark.parametrize(
    ("fixed", "each"),
    [
        (False, "the next ones each time, so successive losses are on other samples"),
        (True, "the same ones each time (eval_fixed_samples)"),
    ],
)
def test_the_report_says_which_validation_samples_each_evaluation_reads(make_config, fixed, each):
    cfg = make_config(eval_interval=50, eval_iters=3, eval_fixed_samples=fixed)
    topology = SimpleNamespace(world_size=1, dp_size=1, tp_size=1)
    report = dict(parameters=1, work=StepWork(2, 1, 32, 1.0), train_iters=10)
    text = startup_report(cfg, topology, dataset_sizes={"train": 8, "valid": 9}, **report)
    line = f"  validation: every 50 iterations, 3 batches × 2 = 6 samples, {each}"
    assert line in text
    bare = startup_report(cfg, topology, dataset_sizes={"train": 8, "valid": None}, **report)
    assert "validation:" not in bare
