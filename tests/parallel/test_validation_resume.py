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
unbroken run's: the departure is listed in docs/gpt-neox.md. With `eval_fixed_samples` every
evaluation reads the first evaluation's samples instead.
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


RESUME = (("unbroken", None, "a"), ("first", 6, "b"), ("resumed", None, "b"))
FIXED = {"eval_fixed_samples": True}


def _validation_reads(rank, world_size, folder, runs=RESUME, changes=None):
    """The validation samples (indices) and training losses of each run: by default unbroken
    to 12, stopped at 6 (its checkpoint), resumed from there to 12."""
    from megatron.data.gpt_dataset import GPTDataset
    from megatron.training import pretrain

    folder, reads, read = Path(folder), [], GPTDataset.__getitem__

    def recording(self, idx):
        if self.name == "valid":
            reads.append(int(idx))
        return read(self, idx)

    GPTDataset.__getitem__ = recording
    found = {}
    try:
        for name, stop, ckpt in runs:
            reads.clear()
            keys = dict(save=str(folder / ckpt), load=str(folder / ckpt), exit_interval=stop)
            result = pretrain(resolve(_settings(folder, name, 12, **keys, **(changes or {})), 1))
            found[name] = (list(reads), result.losses)
    finally:
        GPTDataset.__getitem__ = read
    return found


def test_a_resumed_run_validates_on_the_unbroken_runs_samples(tmp_path):
    runs = run_distributed(_validation_reads, 1, str(tmp_path))[0]
    per_evaluation = EVAL_ITERS * GAS * MICRO
    (unbroken, _), (first, _), (resumed, _) = runs["unbroken"], runs["first"], runs["resumed"]
    assert len(first) == per_evaluation  # the evaluation at 4 (the run ends at 6)
    assert first + resumed[: len(unbroken) - len(first)] == unbroken


def test_fixed_samples_evaluate_the_same_samples_each_time_and_leave_training_alone(tmp_path):
    """eval_fixed_samples: the evaluations at 4, 8 and 12 (and the resumed run's at 8 and 12)
    read the first evaluation's samples again; the training losses, dropout on, are those of
    the run without the key (the fresh iterators' seed draws are undone)."""
    fixed = run_distributed(_validation_reads, 1, str(tmp_path / "fixed"), RESUME, FIXED)[0]
    plain = run_distributed(_validation_reads, 1, str(tmp_path / "plain"), RESUME[:1])[0]
    plain = plain["unbroken"]
    per_evaluation = EVAL_ITERS * GAS * MICRO
    reads, losses = fixed["unbroken"]
    assert reads == plain[0][:per_evaluation] * 3 and len(set(reads)) == per_evaluation
    assert fixed["resumed"][0] == reads[: 2 * per_evaluation]
    assert losses == plain[1]
    assert fixed["first"][1] + fixed["resumed"][1] == losses
