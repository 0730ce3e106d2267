"""`pretrain` options on one or two gloo ranks: every optimizer and LR schedule trains a few
steps, bf16 trains, keep_last_n_checkpoints prunes, finetune / no_load_optim / no_save_optim
load and save what they should, train_epochs sets the length, and metrics.jsonl holds one
record per log interval, with `wall_clock_breakdown`'s timings that DeepSpeed no longer prints
on the console (at every step on the plain engine)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest

from megatron.checkpoint.folders import list_checkpoints, read_latest
from megatron.data import train_samples_per_epoch
from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

OPTIMIZERS = {
    "Adam": {"lr": 2.0e-3},
    "AdamW": {"lr": 2.0e-3},
    "CPU_Adam": {"lr": 2.0e-3},
    "CPU_torch_adam": {"lr": 2.0e-3},
    # 1-bit Adam freezes its second moment after `freeze_step` steps, with no bias correction
    # (as DeepSpeed's): at beta2 0.999 two steps leave v at 0.2% of g², and the compressed
    # steps run up to ~20x Adam's and diverge. beta2 0.5 makes two steps a real estimate of v.
    "OneBitAdam": {"lr": 2.0e-3, "freeze_step": 2, "betas": [0.9, 0.5]},
    "Lion": {"lr": 3.0e-4},
    "SGD": {"lr": 0.3, "momentum": 0.9},
    "SM3": {"lr": 0.1},
    "madgrad_wd": {"lr": 1.0e-2},
}
SCHEDULES = ("constant", "linear", "cosine", "exponential", "inverse_sqrt", "wsd")


def _pretrain_all(rank, world_size, runs):
    from megatron.training import pretrain

    out = []
    for settings in runs:
        console = io.StringIO()  # what the rank prints, DeepSpeed's prints included
        with contextlib.redirect_stdout(console):
            result = pretrain(resolve(settings, world_size))
        out.append(
            {"losses": result.losses, "iteration": result.iteration, "console": console.getvalue()}
        )
    return out


def _quick(folder, **changes):
    base = dict(train_iters=4, eval_interval=0, do_test=False, save=None, load=None)
    return tiny_settings(folder, **{**base, **changes})


def test_every_optimizer_and_schedule_trains(tmp_path):
    runs = [
        _quick(tmp_path / name, optimizer={"type": name, "params": params})
        for name, params in OPTIMIZERS.items()
    ]
    runs += [_quick(tmp_path / s, lr_decay_style=s) for s in SCHEDULES]
    runs.append(_quick(tmp_path / "bf16", precision="bfloat16"))
    runs.append(
        _quick(tmp_path / "bf16_zero1", precision="bfloat16", zero_optimization={"stage": 1})
    )
    runs.append(_quick(tmp_path / "bf16_plain", precision="bfloat16", pipe_parallel_size=0))
    results = run_distributed(_pretrain_all, 2, runs)[0]
    names = list(OPTIMIZERS) + list(SCHEDULES) + ["bf16", "bf16_zero1", "bf16_plain"]
    for name, result in zip(names, results):
        losses = result["losses"]
        assert len(losses) == 4 and all(math.isfinite(x) for x in losses), name
        assert losses[-1] < losses[0], (name, losses)


def test_keep_last_n_finetune_no_load_or_save_optim_epochs_and_metrics(tmp_path):
    keep = tiny_settings(tmp_path / "keep", train_iters=5, checkpoint_factor=1,
                         keep_last_n_checkpoints=2, eval_interval=0, log_param_norm=True,
                         log_grad_norm=True, wall_clock_breakdown=True)  # fmt: skip
    finetune = tiny_settings(tmp_path / "finetune", load=str(tmp_path / "keep" / "ckpt"),
                             finetune=True, train_iters=2, eval_interval=0)  # fmt: skip
    no_optim = tiny_settings(tmp_path / "no_optim", load=str(tmp_path / "keep" / "ckpt"),
                             no_load_optim=True, train_iters=7, eval_interval=0,
                             override_lr_scheduler=True)  # fmt: skip
    # a small training split: about 2 documents
    epochs = _quick(tmp_path / "epochs", train_iters=None, train_epochs=1, split="5,90,5",
                    train_micro_batch_size_per_gpu=16)  # fmt: skip
    no_save = tiny_settings(tmp_path / "no_save", train_iters=3, no_save_optim=True,
                            pipe_parallel_size=0, zero_optimization={"stage": 1},
                            eval_interval=0, wall_clock_breakdown=True)  # fmt: skip
    no_save_resumed = {**no_save, "train_iters": 5, "override_lr_scheduler": True}
    runs = [keep, finetune, no_optim, epochs, no_save, no_save_resumed]
    results = run_distributed(_pretrain_all, 2, runs)[0]
    saved = tmp_path / "keep" / "ckpt"
    assert [it for it, _ in list_checkpoints(saved)] == [4, 5]
    assert read_latest(saved) == "global_step5"
    # finetune: weights only, counting from 0; its loss starts where the trained model is
    assert results[1]["iteration"] == 2
    assert results[1]["losses"][0] < results[0]["losses"][0] - 0.3
    # no_load_optim: position and schedule resume at 5, optimizer state starts fresh
    assert results[2]["iteration"] == 7 and len(results[2]["losses"]) == 2
    # one epoch: all training samples at 64 per step
    per_epoch = train_samples_per_epoch(resolve(epochs, 2))
    assert per_epoch > 64 and results[3]["iteration"] == math.ceil(per_epoch / 64)
    # no_save_optim (ZeRO 1): no optimizer files; the resumed run rebuilds them from weights
    assert not list((tmp_path / "no_save/ckpt/global_step3").glob("*optim_states.pt"))
    assert results[5]["iteration"] == 5 and len(results[5]["losses"]) == 2
    records = [json.loads(x) for x in Path(tmp_path / "keep/logs/metrics.jsonl").open()]
    train = [r for r in records if "split" not in r]
    assert [r["iteration"] for r in train] == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in train] == pytest.approx(results[0]["losses"])
    assert all(r["grad_norm"] > 0 and r["tokens_per_sec"] > 0 for r in train)
    for prefix in ("param_norm/", "grad_norm/", "time/"):  # log_*_norm, wall_clock_breakdown
        assert any(key.startswith(prefix) for key in train[-1]), prefix
    # the time really spent, on both engines (the plain one resets its timers every step),
    # and on the console only our iteration line (DeepSpeed's `time (ms)` lines with --verbose)
    for i, run in ((0, "keep"), (4, "no_save")):
        lines = Path(tmp_path / run / "logs/metrics.jsonl").open()
        last = [r for r in map(json.loads, lines) if "split" not in r][-1]
        assert last.get("time/fwd", 0) > 0 and last.get("time/bwd", 0) > 0, (run, last)
        console = results[i]["console"]
        assert "iteration 3/" in console and "time (ms)" not in console, console[-3000:]
