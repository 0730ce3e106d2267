"""Validation reads the same samples after a resume as the unbroken run, with gradient
accumulation and a checkpoint between two evaluations.

Each evaluation reads `eval_iters` global batches and the next one continues where it stopped;
a resumed run starts the validation data after what the evaluations before its iteration read:
`(iteration // eval_interval) · eval_iters` global batches. GPT-NeoX computes the start as
`((iteration · gradient_accumulation_steps) // eval_interval) · eval_iters` micro-batches of a
rank (its `shift_and_wrap_data_loaders`), which is the same number of samples at an
evaluation boundary (checked below with its formula) and a later one between two of them:
there GPT-NeoX's own resumed run skips batches its unbroken run evaluates on (each of its
evaluations reads `eval_iters · gradient_accumulation_steps` micro-batches). We keep the
unbroken run's: the departure is listed in the README.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron.training.setup.data import valid_samples_consumed
from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_config, tiny_settings

pytestmark = pytest.mark.slow

GAS, INTERVAL, EVAL_ITERS, MICRO = 2, 4, 2, 2


def neox_start(iteration: int, dp: int = 1) -> int:
    """GPT-NeoX's validation start, in samples: micro-batches of each rank times their size."""
    return ((iteration * GAS) // INTERVAL) * EVAL_ITERS * MICRO * dp


def test_the_position_is_gpt_neoxs_at_evaluation_boundaries():
    cfg = tiny_config(train_micro_batch_size_per_gpu=MICRO, gradient_accumulation_steps=GAS,
                      eval_interval=INTERVAL, eval_iters=EVAL_ITERS)  # fmt: skip
    for iteration in (0, 4, 8, 40):
        assert valid_samples_consumed(cfg, iteration) == neox_start(iteration)
    # between two evaluations: one evaluation (at 4) read 2 global batches of 4 samples
    assert valid_samples_consumed(cfg, 6) == 8 and neox_start(6) == 12


def _settings(folder: Path, name: str, iters: int, **changes) -> dict:
    return tiny_settings(folder, train_iters=iters, train_micro_batch_size_per_gpu=MICRO,
                         gradient_accumulation_steps=GAS, eval_interval=INTERVAL,
                         eval_iters=EVAL_ITERS, checkpoint_factor=6, log_dir=str(folder / name),
                         **changes)  # fmt: skip


def _validation_reads(rank, world_size, folder):
    """The validation samples (indices) each run reads: unbroken to 12, stopped at 6 (its
    checkpoint), resumed from there to 12."""
    from megatron.data.gpt_dataset import GPTDataset
    from megatron.training import pretrain

    folder, reads, read = Path(folder), [], GPTDataset.__getitem__

    def recording(self, idx):
        if self.name == "valid":
            reads.append(int(idx))
        return read(self, idx)

    GPTDataset.__getitem__ = recording
    runs = {}
    try:
        for name, stop, ckpt in (
            ("unbroken", None, "a"),
            ("first", 6, "b"),
            ("resumed", None, "b"),
        ):
            reads.clear()
            keys = dict(save=str(folder / ckpt), load=str(folder / ckpt), exit_interval=stop)
            pretrain(resolve(_settings(folder, name, 12, **keys), 1))
            runs[name] = list(reads)
    finally:
        GPTDataset.__getitem__ = read
    return runs


def test_a_resumed_run_validates_on_the_unbroken_runs_samples(tmp_path):
    runs = run_distributed(_validation_reads, 1, str(tmp_path))[0]
    per_evaluation = EVAL_ITERS * GAS * MICRO
    unbroken, first, resumed = runs["unbroken"], runs["first"], runs["resumed"]
    assert len(first) == per_evaluation  # the evaluation at 4 (the run ends at 6)
    assert first + resumed[: len(unbroken) - len(first)] == unbroken
