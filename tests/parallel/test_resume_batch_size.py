"""Resuming at another global batch size (issue 16): a run trains 4 steps on one rank at global
batch 8, then resumes on two data-parallel ranks at global batch 16 (same micro batch).

The test records every training sample the data loaders hand out (index and tokens): the
resumed ranks together read exactly the samples after the 32 consumed ones, each once, with
the tokens the first run's dataset holds at those places (the dataset is rebuilt here, in the
test, at the first run's size). The LR keeps GPT-NeoX's meaning (a function of the iteration,
whatever the batch), checked against the cosine schedule written out below; the start-up
report says that the layout changed and the dropout streams restart from the seed.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

PEAK, MIN_LR, WARMUP, TRAIN_ITERS = 2.0e-3, 1.0e-4, 0.2, 8


def _settings(folder: Path, phase: str, **changes) -> dict:
    return tiny_settings(
        folder,
        train_iters=TRAIN_ITERS,
        train_micro_batch_size_per_gpu=4,
        gradient_accumulation_steps=2,
        eval_interval=100,
        log_dir=str(folder / f"logs_{phase}"),
        **changes,
    )


def _train_recording_samples(rank, world_size, settings):
    """pretrain, recording (index, tokens) of every training sample this rank reads."""
    from megatron.data.gpt_dataset import GPTDataset
    from megatron.training import pretrain

    seen, read = [], GPTDataset.__getitem__

    def recording(self, idx):
        sample = read(self, idx)
        if self.name == "train":
            seen.append((int(idx), sample["text"].tolist()))
        return sample

    GPTDataset.__getitem__ = recording
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            pretrain(resolve(settings, world_size))
    finally:
        GPTDataset.__getitem__ = read
    return {"seen": seen, "console": out.getvalue()}


def _neox_cosine(n: float) -> float:
    """GPT-NeoX's AnnealingLR (cosine) after n steps; warm-up and decay in iterations."""
    warmup = WARMUP * TRAIN_ITERS
    if n <= warmup:
        return PEAK * max(1, n) / warmup
    progress = (n - warmup) / (TRAIN_ITERS - warmup)
    return MIN_LR + (PEAK - MIN_LR) / 2 * (math.cos(math.pi * progress) + 1)


def _logged_lr(log_dir: Path) -> dict[int, float]:
    lines = (log_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {r["iteration"]: r["lr"] for r in records if "lr" in r and "split" not in r}


def test_resume_at_a_larger_global_batch_continues_the_stream(tmp_path):
    from megatron.data import build_train_valid_test_datasets

    first = _settings(tmp_path, "first", exit_interval=4)
    (a,) = run_distributed(_train_recording_samples, 1, first, timeout=600)
    resumed = _settings(tmp_path, "resumed")
    b = run_distributed(_train_recording_samples, 2, resumed, timeout=600)

    # The first run read samples 0..31 (4 steps of 8), in order.
    assert [i for i, _ in a["seen"]] == list(range(32))
    # Each resumed rank reads its micro-batches of every global batch of 16: together exactly
    # 32..95, once each; rank 0 takes the first 4 of each 8-sample micro-step.
    indices = [i for r in b for i, _ in r["seen"]]
    assert sorted(indices) == list(range(32, 96))
    assert [i for i, _ in b[0]["seen"]][:8] == [32, 33, 34, 35, 40, 41, 42, 43]
    # ... with the tokens the first run's data holds there (its dataset, built for 64 samples).
    train = build_train_valid_test_datasets(resolve(first, 1), [TRAIN_ITERS * 8, 0, 0])[0]
    for rank in (a, *b):
        for i, tokens in rank["seen"]:
            assert tokens == train[i]["text"].tolist(), i

    # LR: a function of the iteration, as in an unbroken run (GPT-NeoX's meaning).
    lr_first = _logged_lr(tmp_path / "logs_first")
    lr_resumed = _logged_lr(tmp_path / "logs_resumed")
    assert sorted(lr_first) == [1, 2, 3, 4] and sorted(lr_resumed) == [5, 6, 7, 8]
    # The logged LR is the one for the next step (the scheduler stepped after step k).
    for k, lr in {**lr_first, **lr_resumed}.items():
        assert lr == pytest.approx(_neox_cosine(k), rel=1e-6), k

    # The layout changed (dp 1 -> 2): said once, at start-up, by rank 0.
    notice = "layout changed from (tp,pp,dp)=(1,1,1) to (1,1,2): dropout RNG streams restart"
    assert notice in b[0]["console"] and b[0]["console"].count("layout changed") == 1
    assert "layout changed" not in a["console"] + b[1]["console"]
