"""Our own LR styles (inverse_sqrt, wsd) at chosen iterations, warm-up, bad names, and resume
behaviour of the scheduler state. GPT-NeoX's styles are checked against NeoX in
`test_lr_neox.py`."""

from __future__ import annotations

import math

import pytest
import torch

from megatron.training.optim.lr.schedule import (
    AnnealingLR,
    ScheduleSettings,
    build_lr_scheduler,
    lr_at,
)


def lr_of(style, it, *, peak=1.0, min_lr=0.1, warmup=10, decay=130, **kw):
    s = ScheduleSettings(
        peak_lr=peak,
        min_lr=min_lr,
        warmup_iters=warmup,
        decay_iters=decay,
        decay_style=style,
        num_iters=it,
        **kw,
    )
    return lr_at(s)


@pytest.mark.parametrize("style", ["constant", "linear", "cosine", "exponential", "wsd"])
def test_warmup_is_linear_and_its_first_step_is_not_zero(style):
    # GPT-NeoX's current warm-up: peak × max(1, n) / w
    assert lr_of(style, 0) == pytest.approx(0.1)
    assert lr_of(style, 1) == pytest.approx(0.1)
    assert lr_of(style, 5) == pytest.approx(0.5)
    assert lr_of(style, 10) == pytest.approx(1.0)


def test_exponential_and_inverse_sqrt_are_floored_at_min_lr():
    assert lr_of("exponential", 130, min_lr=0.8) == 0.8
    assert lr_of("inverse_sqrt", 16, warmup=4) == pytest.approx(0.5)
    assert lr_of("inverse_sqrt", 64, warmup=4) == pytest.approx(0.25)
    assert lr_of("inverse_sqrt", 400, warmup=4) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "tail, it, expected",
    [
        ("linear", 80, 1.0),  # stable until decay_iters - 0.2 × decay_iters
        ("linear", 90, 0.55),
        ("linear", 100, 0.1),
        ("cosine", 90, 0.55),
        ("cosine", 85, 0.1 + 0.45 * (1 + math.cos(math.pi / 4))),
        ("inverse_sqrt", 85, 0.55),  # 1 - sqrt(1/4) = 1/2
        # Megatron-LM's exponential WSD decay: min_lr + (peak - min_lr)(2 · 0.5^q - 1)
        ("exponential", 90, 0.1 + 0.9 * (2 * 0.5**0.5 - 1)),
        ("exponential", 100, 0.1),  # min_lr at the end of the decay
    ],
)
def test_warmup_stable_decay(tail, it, expected):
    got = lr_of("wsd", it, decay=100, wsd_decay_fraction=0.2, wsd_decay_style=tail)
    assert got == pytest.approx(expected, rel=1e-12)


def test_no_warmup_starts_at_peak():
    assert lr_of("linear", 0, warmup=0, decay=100, min_lr=0.0) == 1.0
    assert lr_of("linear", 25, warmup=0, decay=100, min_lr=0.0) == pytest.approx(0.75)


def test_bad_style_names_the_valid_ones():
    with pytest.raises(ValueError, match="cosine"):
        ScheduleSettings(peak_lr=1.0, decay_style="cosin")
    with pytest.raises(ValueError, match="wsd_decay_style"):
        ScheduleSettings(peak_lr=1.0, decay_style="wsd", wsd_decay_style="step")


def _opt():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=123.0)


def test_scheduler_sets_group_lrs_and_steps():
    opt = _opt()
    opt.param_groups[0]["lr_scale"] = 0.5
    sched = AnnealingLR(opt, ScheduleSettings(peak_lr=1.0, warmup_iters=4, decay_iters=8))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.125)  # 0.5 × max(1, 0) / 4
    for _ in range(2):
        sched.step()
    assert sched.get_last_lr() == [pytest.approx(0.25)]
    assert sched.num_iters == 2


def test_from_config_derives_warmup_fraction(make_config):
    cfg = make_config(warmup=0.1, lr_decay_style="cosine", min_lr=1.0e-5)
    sched = build_lr_scheduler(cfg, _opt())
    s = sched.settings
    assert (s.warmup_iters, s.decay_iters, s.peak_lr, s.min_lr) == (20, 200, 1.0e-3, 1.0e-5)
    # run length known only at run time (train_epochs): derived from the given iterations
    cfg = make_config(train_iters=None, train_epochs=1, warmup=0.1, lr_decay_fraction=0.5)
    s = build_lr_scheduler(cfg, _opt(), train_iters=400).settings
    assert (s.warmup_iters, s.decay_iters) == (20, 200)


def _resumed(saved: ScheduleSettings, ours: ScheduleSettings, **flags) -> AnnealingLR:
    old = AnnealingLR(_opt(), saved)
    for _ in range(7):
        old.step()
    new = AnnealingLR(_opt(), ours, **flags)
    new.load_state_dict(old.state_dict())
    return new


def test_resume_with_same_curve_takes_the_step_count():
    new = _resumed(ScheduleSettings(1.0, 0, 2, 10), ScheduleSettings(1.0, 0, 2, 10))
    assert new.num_iters == 7
    assert new.get_last_lr() == [pytest.approx(1.0 * 3 / 8)]


def test_resume_with_different_curve_needs_a_choice():
    saved, ours = ScheduleSettings(1.0, 0, 2, 10), ScheduleSettings(2.0, 0, 2, 10)
    with pytest.raises(ValueError, match="peak_lr.*override_lr_scheduler"):
        _resumed(saved, ours)
    new = _resumed(saved, ScheduleSettings(2.0, 0, 2, 10), override_lr_scheduler=True)
    assert (new.settings.peak_lr, new.num_iters) == (2.0, 7)
    new = _resumed(saved, ScheduleSettings(2.0, 0, 2, 10), use_checkpoint_lr_scheduler=True)
    assert (new.settings.peak_lr, new.num_iters) == (1.0, 7)
    with pytest.raises(ValueError, match="at most one"):
        AnnealingLR(_opt(), ours, override_lr_scheduler=True, use_checkpoint_lr_scheduler=True)


def test_every_configurable_style_has_one_class_and_every_class_a_name():
    from megatron.training.optim.lr.settings import DECAY_STYLE_NAMES, WSD_TAIL_NAMES
    from megatron.training.optim.lr.styles import DECAY_STYLES, WSD_TAILS

    assert set(DECAY_STYLE_NAMES) == set(DECAY_STYLES)
    assert set(WSD_TAIL_NAMES) == set(WSD_TAILS)
