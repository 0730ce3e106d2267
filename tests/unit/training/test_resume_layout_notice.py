"""The start-up notice of a resume at another layout, and the training-split size of a resume
at another global batch size (`data_setup.train_samples_needed`)."""

from __future__ import annotations

from megatron.training.metrics.report import layout_change_notice
from megatron.training.setup.data import train_samples_needed

NOW = {"tp": 1, "pp": 1, "dp": 2}


def test_notice_only_when_the_layout_changed():
    assert layout_change_notice(None, NOW) is None  # fresh run, or a checkpoint without record
    assert layout_change_notice(dict(NOW), NOW) is None
    text = layout_change_notice({"tp": 1, "pp": 1, "dp": 1}, NOW)
    assert text.startswith(
        "layout changed from (tp,pp,dp)=(1,1,1) to (1,1,2): dropout RNG streams restart from "
        "the seed; the run is not bitwise identical to an uninterrupted one"
    )


def test_train_samples_continue_from_consumed_samples():
    assert train_samples_needed(8, 8) == 64  # fresh: GPT-NeoX's train_iters x batch
    resumed = {"iteration": 4, "consumed_samples": 32, "train_samples": 64}
    assert train_samples_needed(8, 16, resumed) == 32 + 4 * 16  # larger batch: more
    assert train_samples_needed(8, 4, resumed) == 64  # smaller: the saved build (same order)
    assert train_samples_needed(8, 16, {"iteration": 4, "consumed_samples": 32}) == 96
