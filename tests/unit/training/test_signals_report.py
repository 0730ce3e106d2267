"""SIGTERM/SIGINT are remembered (not fatal) until the loop stops; the start-up report."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from megatron.training.report import startup_report
from megatron.training.signals import StopRequest


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
        flops_per_token=835_584.0,
        train_iters=200,
        dataset_sizes={"train": 3112, "valid": 260, "test": None},
    )
    assert "132,864 parameters (132.86K)" in text
    assert "global 4 = micro 2 × accumulation 2 × data-parallel 1 = 128 tokens per step" in text
    assert "train 3,112 samples, valid 260 samples, test none" in text
    assert "FLOPs per token (training, model FLOPs): 835.58K" in text
    assert "MFU against 312 TFLOP/s per device (peak_theoretical_tflops)" in text
