"""The LR schedule equals GPT-NeoX's `AnnealingLR` at every iteration of a run.

The expected values come from GPT-NeoX's current definitions, written out here from
`megatron/learning_rates.py` (`AnnealingLR.get_lr`, whose warm-up is peak × max(1, n) / w since
NeoX's fix "warmup LR being zero at step 0") and `megatron/training.py`
(`get_learning_rate_scheduler`: decay over `lr_decay_iters`, else
floor(`lr_decay_fraction` × train_iters), else train_iters, at least 1; warm-up =
`warmup` × that, unrounded). The scheduler under test is the one the trainer builds
(`build_lr_scheduler`, called by `engine_setup.build_engine`) from a resolved config, stepped
like DeepSpeed steps it; the end-to-end test reads the LR the trainer logs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from megatron.training.optim.lr.schedule import build_lr_scheduler

NEOX_STYLES = ("constant", "linear", "cosine", "exponential")


def neox_warmup_and_decay(train_iters, warmup, lr_decay_iters=None, lr_decay_fraction=None):
    """GPT-NeoX's `get_learning_rate_scheduler`: (warmup_iter, total_iters)."""
    if lr_decay_iters is not None:
        total = lr_decay_iters
    elif lr_decay_fraction is not None:
        total = math.floor(train_iters * lr_decay_fraction)
    else:
        total = train_iters
    total = max(1, total)
    return warmup * total, total


def neox_lr(num_iters, *, start_lr, min_lr, warmup_iter, end_iter, style):
    """GPT-NeoX's `AnnealingLR.get_lr` after `num_iters` steps."""
    if warmup_iter > 0 and num_iters <= warmup_iter:
        return float(start_lr) * max(1, num_iters) / warmup_iter
    since = num_iters - warmup_iter
    length = end_iter - warmup_iter
    if style == "linear":
        lr = start_lr * (length - since) / length
    elif style == "cosine":
        lr = min_lr + (start_lr - min_lr) / 2.0 * (math.cos(math.pi * since / length) + 1)
    elif style == "exponential":
        lr = start_lr * math.exp(-0.693 * since / length)
    else:
        lr = start_lr
    return max(lr, min_lr)


def _optimizer():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.5)


def _assert_run_matches(cfg, neox, steps):
    """Step the trainer's scheduler `steps` times; the group LR after each step (and before
    the first) must be NeoX's."""
    opt = _optimizer()
    sched = build_lr_scheduler(cfg, opt)
    for n in range(steps + 1):
        expected = neox_lr(n, **neox)
        got = opt.param_groups[0]["lr"]
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-18), (n, got, expected)
        assert sched.get_lr() == got
        sched.step()


@pytest.mark.parametrize("style", NEOX_STYLES)
@pytest.mark.parametrize("min_lr", [0.0, 2.5e-4])
@pytest.mark.parametrize("warmup", [0.0, 0.01, 0.13])
def test_every_iteration_of_a_run_is_neox(make_config, style, min_lr, warmup):
    # 250 iterations: a warm-up of 0.01 is 2.5 iterations and of 0.13 is 32.5 in NeoX
    cfg = make_config(
        train_iters=250, lr_decay_style=style, min_lr=min_lr, warmup=warmup,
        optimizer={"type": "Adam", "params": {"lr": 1.0e-3}},
    )  # fmt: skip
    warmup_iter, end_iter = neox_warmup_and_decay(250, warmup)
    neox = dict(
        start_lr=1.0e-3, min_lr=min_lr, warmup_iter=warmup_iter, end_iter=end_iter, style=style
    )
    _assert_run_matches(cfg, neox, 250)


@pytest.mark.parametrize("warmup", [1, 1.0])
def test_warmup_of_one_is_the_whole_decay(make_config, warmup):
    """NeoX's `warmup` is a fraction of the decay iterations: 1 (int or float) warms up over
    all 250 of them, not over one iteration."""
    cfg = make_config(
        train_iters=250, lr_decay_style="constant", warmup=warmup,
        optimizer={"type": "Adam", "params": {"lr": 1.0e-3}},
    )  # fmt: skip
    warmup_iter, end_iter = neox_warmup_and_decay(250, warmup)
    assert cfg.lr.warmup_iters == warmup_iter == 250
    neox = dict(
        start_lr=1.0e-3, min_lr=0.0, warmup_iter=warmup_iter, end_iter=end_iter, style="constant"
    )
    _assert_run_matches(cfg, neox, 250)


def test_first_step_moves_the_weights(make_config):
    """NeoX's current warm-up: before any step the LR is already that of the second step
    (20 warm-up iterations: peak / 20), not 0."""
    cfg = make_config(
        train_iters=200, lr_decay_style="cosine", warmup=0.1,
        optimizer={"type": "Adam", "params": {"lr": 1.0e-3}},
    )  # fmt: skip
    opt = _optimizer()
    sched = build_lr_scheduler(cfg, opt)
    assert opt.param_groups[0]["lr"] == pytest.approx(5.0e-5, rel=1e-12)
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(5.0e-5, rel=1e-12)


def test_warmup_shorter_than_an_iteration_stays_at_the_peak(make_config):
    """A warm-up of 0.5 iterations: NeoX's peak × max(1, 0) / 0.5 would be twice the peak;
    ours is capped at the peak, then decays as NeoX does."""
    cfg = make_config(
        train_iters=250, lr_decay_style="linear", warmup=0.002,
        optimizer={"type": "Adam", "params": {"lr": 1.0e-3}},
    )  # fmt: skip
    opt = _optimizer()
    sched = build_lr_scheduler(cfg, opt)
    assert opt.param_groups[0]["lr"] == 1.0e-3
    sched.step()
    neox = neox_lr(1, start_lr=1.0e-3, min_lr=0.0, warmup_iter=0.5, end_iter=250, style="linear")
    assert opt.param_groups[0]["lr"] == pytest.approx(neox, rel=1e-12)


@pytest.mark.parametrize("style", NEOX_STYLES)
@pytest.mark.parametrize(
    "decay_keys", [dict(lr_decay_iters=90), dict(lr_decay_fraction=0.57)], ids=["iters", "frac"]
)
def test_decay_shorter_than_the_run_is_neox_past_its_end(make_config, style, decay_keys):
    """Past the decay end NeoX keeps its formulas: linear and exponential fall to min_lr,
    cosine climbs back."""
    cfg = make_config(
        train_iters=203, lr_decay_style=style, min_lr=1.0e-5, warmup=0.05, **decay_keys,
        optimizer={"type": "Adam", "params": {"lr": 6.0e-4}},
    )  # fmt: skip
    warmup_iter, end_iter = neox_warmup_and_decay(203, 0.05, **decay_keys)
    neox = dict(
        start_lr=6.0e-4, min_lr=1.0e-5, warmup_iter=warmup_iter, end_iter=end_iter, style=style
    )
    _assert_run_matches(cfg, neox, 203)


def test_linear_with_min_lr_clips_instead_of_interpolating(make_config):
    # half-way through the decay NeoX is at peak/2, not (peak + min_lr)/2
    cfg = make_config(
        train_iters=100, lr_decay_style="linear", min_lr=2.0e-4, warmup=0.0,
        optimizer={"type": "Adam", "params": {"lr": 1.0e-3}},
    )  # fmt: skip
    opt = _optimizer()
    sched = build_lr_scheduler(cfg, opt)
    sched.step(50)
    assert opt.param_groups[0]["lr"] == pytest.approx(5.0e-4, rel=1e-12)
    sched.step(35)  # 85 steps: 1.5e-4 by the line, clipped at min_lr
    assert opt.param_groups[0]["lr"] == 2.0e-4


def test_run_length_known_at_run_time_is_derived_like_neox(make_config):
    """`train_epochs`: the iterations are known only once the data is read."""
    cfg = make_config(
        train_iters=None, train_epochs=1, warmup=0.03, lr_decay_fraction=0.8,
        lr_decay_style="cosine", min_lr=1.0e-5,
    )  # fmt: skip
    opt = _optimizer()
    sched = build_lr_scheduler(cfg, opt, train_iters=137)
    warmup_iter, end_iter = neox_warmup_and_decay(137, 0.03, lr_decay_fraction=0.8)
    assert (sched.settings.warmup_iters, sched.settings.decay_iters) == (warmup_iter, end_iter)
    for n in range(138):
        expected = neox_lr(
            n, start_lr=1.0e-3, min_lr=1.0e-5, warmup_iter=warmup_iter, end_iter=end_iter,
            style="cosine",
        )  # fmt: skip
        assert opt.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12), n
        sched.step()


def _train_one_rank(rank, world_size, settings):
    from megatron.training import pretrain
    from tests.tiny import resolve

    pretrain(resolve(settings, world_size))


@pytest.mark.slow
@pytest.mark.parametrize("style", ["linear", "cosine"])
def test_trainer_logs_neox_lr(tmp_path, style):
    """A real run (one gloo rank, pipeline engine): the `lr` of every metrics.jsonl record is
    NeoX's LR after that many steps."""
    from tests.distributed import run_distributed
    from tests.tiny import tiny_settings

    settings = tiny_settings(
        tmp_path, train_iters=12, lr_decay_iters=9, warmup=0.3, min_lr=5.0e-4,
        lr_decay_style=style, eval_interval=0, do_test=False, save=None, load=None,
    )  # fmt: skip
    run_distributed(_train_one_rank, 1, settings)
    records = [
        json.loads(line)
        for line in Path(tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    train = [r for r in records if "split" not in r and r.get("lr") is not None]
    assert [r["iteration"] for r in train] == list(range(1, 13))
    warmup_iter, end_iter = neox_warmup_and_decay(12, 0.3, lr_decay_iters=9)  # 2.7 of 9
    for r in train:
        expected = neox_lr(
            r["iteration"], start_lr=2.0e-3, min_lr=5.0e-4, warmup_iter=warmup_iter,
            end_iter=end_iter, style=style,
        )  # fmt: skip
        assert r["lr"] == pytest.approx(expected, rel=1e-9), r
