"""Levanter's LR cycles and `inv` decay, stepped through the scheduler the trainer builds.

The expected curves are Levanter's definitions (its configuration guide and
`levanter/optim/config.py::OptimizerConfig.lr_scheduler`), written out here as Levanter writes
them: a list of cycle minima, then per cycle a join of optax pieces (linear (re)warm-up from the
previous cycle's final LR, a constant stable piece, the decay), each piece counting from its own
boundary. One change to Levanter: the first warm-up is GPT-NeoX's current one, peak × max(1, n)
/ w, so the first step of training does not have LR 0. The decay shapes are Levanter's: optax's
`linear_schedule` from the peak to min_lr over the decay, optax's `cosine_decay_schedule` with
alpha = min_lr / peak (equal to GPT-NeoX's cosine), Levanter's `inv`; exponential, which
Levanter lacks, is GPT-NeoX's, clipped at min_lr.
"""

from __future__ import annotations

import math

import pytest
import torch

from megatron.config.schema import ConfigError
from megatron.training.optim.lr.schedule import AnnealingLR, build_lr_scheduler

PEAK, MIN = 1.0e-3, 1.0e-4


def optax_cosine(count, steps, peak=PEAK, alpha=MIN / PEAK):
    """optax.cosine_decay_schedule(peak, steps, alpha)(count)."""
    count = min(count, steps)
    return peak * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * count / steps)) + alpha)


def optax_linear(count, steps, peak=PEAK, end=MIN):
    """optax.linear_schedule(peak, end, steps)(count): a polynomial schedule of power 1."""
    frac = 1 - min(count, steps) / steps
    return (peak - end) * frac + end


def levanter_inv(count, steps, peak=PEAK, min_lr=MIN):
    """levanter/optim/config.py `_inv_decay_schedule`."""
    decay = min(1.0, 1.0 / ((peak / min_lr - 1) * max(count, 1) / steps + 1))
    return max(peak * decay, min_lr)


def levanter_lr(n, minima, *, warmup, rewarmup, decay, shape, peak=PEAK):
    """Levanter's joined schedule at step `n`; `warmup`, `rewarmup`, `decay` in steps (or
    `decay` None: the rest of the cycle), `minima` = [0, ends...]."""
    pieces, previous_end = [], 0.0  # (start step, function of the count from that start)
    for cycle, (start, end) in enumerate(zip(minima[:-1], minima[1:], strict=False)):
        length = end - start
        warm = warmup if cycle == 0 else rewarmup
        fall = length - warm if decay is None else decay
        if warm and cycle == 0:  # GPT-NeoX's current warm-up: its first step is not at 0
            pieces.append((start, lambda c, w=warm: peak * max(1, min(c, w)) / w))
        elif warm:
            pieces.append((start, lambda c, a=previous_end, w=warm: a + (peak - a) * min(c, w) / w))
        if length - warm - fall:
            pieces.append((start + warm, lambda c: peak))
        pieces.append((end - fall, lambda c, f=fall: shape(c, f)))
        previous_end = shape(fall, fall)
    start, fn = [(s, f) for s, f in pieces if s <= n][-1]
    return fn(n - start)


def assert_levanter(lrs, minima, *, warmup, rewarmup=0, decay=None, shape):
    """Every stepped LR equals Levanter's joined schedule at that step."""
    for n, lr in enumerate(lrs):
        expected = levanter_lr(
            n, minima, warmup=warmup, rewarmup=rewarmup, decay=decay, shape=shape
        )
        assert lr == pytest.approx(expected, rel=1e-12), (n, lr, expected)


def _stepped(cfg, steps):
    """The group LR before the first step and after each of `steps` steps."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.5)
    sched = build_lr_scheduler(cfg, opt)
    lrs = []
    for _ in range(steps + 1):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
    return lrs


def _config(make_config, **keys):
    return make_config(min_lr=MIN, optimizer={"type": "Adam", "params": {"lr": PEAK}}, **keys)


def test_the_first_cycle_is_warmup_then_decay(make_config):
    # 3 cycles of 30 over 90 iterations; warmup 0.1 of the first cycle = 3 iterations
    cfg = _config(make_config, train_iters=90, lr_cycles=3, warmup=0.1, lr_decay_style="cosine")
    lrs = _stepped(cfg, 30)
    assert lrs[:4] == pytest.approx([PEAK / 3, PEAK / 3, 2 * PEAK / 3, PEAK], rel=1e-12)
    for n in range(3, 30):
        assert lrs[n] == pytest.approx(optax_cosine(n - 3, 27), rel=1e-12), n
    assert lrs[30] == pytest.approx(PEAK, rel=1e-12)  # cycle 2, no re-warm-up: the peak again


@pytest.mark.parametrize("style, shape", [("linear", optax_linear), ("cosine", optax_cosine)])
def test_rewarmup_zero_jumps_back_to_the_peak(make_config, style, shape):
    cfg = _config(make_config, train_iters=100, lr_cycles=[40], warmup=5, lr_decay_style=style)
    lrs = _stepped(cfg, 100)
    assert lrs[39] == pytest.approx(shape(34, 35), rel=1e-12)  # one step before the minimum
    assert lrs[40] == pytest.approx(PEAK, rel=1e-12)
    assert_levanter(lrs[:101], [0, 40, 100], warmup=5, shape=shape)


def test_rewarmup_climbs_linearly_from_the_previous_cycle_end(make_config):
    # exponential ends its cycle at peak × exp(-0.693), not at min_lr: the climb starts there
    cfg = _config(
        make_config, train_iters=80, lr_cycles=2, warmup=0, lr_rewarmup=0.25,
        lr_decay_style="exponential",
    )  # fmt: skip
    lrs = _stepped(cfg, 80)
    bottom = PEAK * math.exp(-0.693)
    for k in range(11):  # 0.25 of the 40-iteration second cycle
        assert lrs[40 + k] == pytest.approx(bottom + (PEAK - bottom) * k / 10, rel=1e-12), k
    assert lrs[39] > bottom > lrs[39] * 0.95


def test_linear_cycles_decay_to_min_lr_over_the_whole_decay(make_config):
    # Levanter: half-way through a cycle's decay the LR is half-way between peak and min_lr,
    # and min_lr comes at the end of the decay (GPT-NeoX's line, clipped, would reach it early)
    cfg = make_config(
        train_iters=100, lr_cycles=2, warmup=0, lr_decay_style="linear", min_lr=5.0e-4,
        optimizer={"type": "Adam", "params": {"lr": PEAK}},
    )  # fmt: skip
    lrs = _stepped(cfg, 100)
    assert lrs[25] == pytest.approx((PEAK + 5.0e-4) / 2, rel=1e-12)
    assert lrs[49] == pytest.approx(5.0e-4 + (PEAK - 5.0e-4) / 50, rel=1e-12)
    assert lrs[100] == pytest.approx(5.0e-4, rel=1e-12)


CYCLE_KEYS = [
    (dict(lr_cycles=3), [0, 33, 66, 100]),
    (dict(lr_cycles=[10, 25, 50]), [0, 10, 25, 50, 100]),
    (dict(lr_cycles=[30, 100]), [0, 30, 100]),
    (dict(lr_cycle_length=30), [0, 30, 60, 100]),  # Levanter: the remainder joins the last
    (dict(lr_cycle_length=0.25), [0, 25, 50, 75, 100]),
    (dict(lr_cycle_length=[20, 30]), [0, 20, 50, 100]),
    (dict(lr_cycles=1), [0, 100]),
]


@pytest.mark.parametrize("keys, minima", CYCLE_KEYS, ids=[str(k) for k, _ in CYCLE_KEYS])
def test_cycle_keys_give_levanters_boundaries(make_config, keys, minima):
    cfg = _config(make_config, train_iters=100, warmup=4, lr_decay_style="linear", **keys)
    lrs = _stepped(cfg, 100)
    assert_levanter(lrs[:101], minima, warmup=4, shape=optax_linear)


@pytest.mark.parametrize("warmup", [1, 1.0])
def test_warmup_of_one_is_the_whole_first_cycle(make_config, warmup):
    # Levanter reads a value <= 1 (int or float) as a fraction: the first cycle is all warm-up
    cfg = _config(make_config, train_iters=100, lr_cycles=2, warmup=warmup, lr_decay_style="cosine")
    lrs = _stepped(cfg, 100)
    assert lrs[:50] == pytest.approx([PEAK * max(1, n) / 50 for n in range(50)], rel=1e-12)
    for n in range(50, 101):  # cycle 2: no re-warm-up, a cosine over its 50 iterations
        assert lrs[n] == pytest.approx(optax_cosine(n - 50, 50), rel=1e-12), n


def test_cycle_decay_leaves_a_stable_phase(make_config):
    # Levanter's `decay`: 0.4 of each 50-iteration cycle decays; the rest after warm-up holds
    cfg = _config(
        make_config, train_iters=100, lr_cycles=2, warmup=5, lr_rewarmup=10,
        lr_cycle_decay=0.4, lr_decay_style="cosine",
    )  # fmt: skip
    lrs = _stepped(cfg, 100)
    assert lrs[5:31] == [PEAK] * 26 and lrs[60:71] == [PEAK] * 11
    assert_levanter(lrs[:101], [0, 50, 100], warmup=5, rewarmup=10, decay=20, shape=optax_cosine)


def test_wsd_decays_over_the_last_fraction_of_each_cycle(make_config):
    cfg = _config(
        make_config, train_iters=60, lr_cycles=2, warmup=0, lr_decay_style="wsd",
        wsd_decay_fraction=0.2,
    )  # fmt: skip
    lrs = _stepped(cfg, 60)
    line = [MIN + (PEAK - MIN) * (1 - q / 6) for q in range(6)]  # the last 6 of each 30
    assert lrs[:25] == [PEAK] * 25 and lrs[30:55] == [PEAK] * 25
    assert lrs[24:30] == pytest.approx(line, rel=1e-12)
    assert lrs[54:60] == pytest.approx(line, rel=1e-12)
    assert lrs[60] == pytest.approx(MIN, rel=1e-12)


def test_inv_is_levanters_formula_with_and_without_cycles(make_config):
    cfg = _config(make_config, train_iters=50, warmup=10, lr_decay_style="inv")
    lrs = _stepped(cfg, 60)
    assert lrs[:11] == pytest.approx([PEAK * max(1, n) / 10 for n in range(11)], rel=1e-12)
    for n in range(11, 61):  # the decay spans the 40 iterations after warm-up
        assert lrs[n] == pytest.approx(levanter_inv(n - 10, 40), rel=1e-12), n
    assert lrs[50] == pytest.approx(MIN, rel=1e-12)
    cfg = _config(make_config, train_iters=50, warmup=0, lr_decay_style="inv", lr_cycles=[20])
    lrs = _stepped(cfg, 50)
    assert_levanter(lrs[:51], [0, 20, 50], warmup=0, shape=levanter_inv)


def test_decay_iters_bound_the_cycles(make_config):
    # the cycles divide the decay iterations (here 60 of 100); after them the LR holds
    cfg = _config(
        make_config, train_iters=100, lr_decay_iters=60, lr_cycles=2, warmup=0,
        lr_decay_style="cosine",
    )  # fmt: skip
    lrs = _stepped(cfg, 100)
    assert lrs[30] == pytest.approx(PEAK, rel=1e-12)
    assert lrs[60:] == pytest.approx([MIN] * 41, rel=1e-12)


REFUSED = [
    (dict(lr_cycles=2, lr_cycle_length=10), "lr_cycles.*lr_cycle_length"),
    (dict(lr_cycles=[30, 20]), "lr_cycles.*increasing"),
    (dict(lr_cycles=[20, 150]), "lr_cycles.*150.*train_iters 100"),
    (dict(lr_cycles=[20, 80], lr_decay_iters=50), "lr_cycles.*80.*lr_decay_iters"),
    (dict(lr_cycle_length=[60, 60]), "lr_cycle_length.*120.*train_iters"),
    (dict(lr_cycle_length=1.5), "lr_cycle_length 1.5.*whole number"),
    (dict(warmup=1.5), "warmup 1.5.*decay iterations.*whole number"),
    (dict(warmup=-0.1, lr_cycles=2), "warmup -0.1.*fraction"),
    (dict(lr_cycles=0), "lr_cycles 0"),
    (dict(lr_rewarmup=0.1), "lr_rewarmup.*neither lr_cycles nor lr_cycle_length"),
    (dict(lr_cycles=2, lr_decay_style="inverse_sqrt"), "inverse_sqrt.*cycles"),
    (dict(lr_cycles=2, lr_decay_style="wsd", lr_cycle_decay=0.5), "lr_cycle_decay.*wsd"),
    (dict(lr_cycles=4, warmup=0.2, lr_cycle_decay=0.9), "cycle 1.*warmup \\(5\\).*lr_cycle_decay"),
    (dict(lr_cycles=4, warmup=30), "cycle 1.*warmup \\(30\\)"),
    # no decay: the schedule would drop from the peak to min_lr (Levanter refuses it for cosine)
    (dict(lr_cycles=2, lr_cycle_decay=0, lr_decay_style="cosine"), "lr_cycle_decay 0.*cycle 1"),
    (dict(lr_cycles=2, lr_cycle_decay=0.01), "lr_cycle_decay 0.01.*no iteration to decay"),
    (dict(lr_decay_style="inv", min_lr=0.0), "inv.*min_lr.*> 0"),
]


@pytest.mark.parametrize("keys, message", REFUSED, ids=[m for _, m in REFUSED])
def test_impossible_cycles_are_refused(make_config, keys, message):
    with pytest.raises(ConfigError, match=message):
        make_config(**{"train_iters": 100, "min_lr": MIN, **keys})


def test_resume_takes_the_step_count_and_checks_the_cycles(make_config):
    cycled = _config(make_config, train_iters=60, lr_cycles=3, lr_rewarmup=0.5, warmup=0)
    plain = _config(make_config, train_iters=60, warmup=0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.5)
    old = build_lr_scheduler(cycled, opt)
    old.step(25)
    state = old.state_dict()
    new = build_lr_scheduler(cycled, opt)
    new.load_state_dict(state)
    assert (new.num_iters, new.get_lr()) == (25, old.get_lr())
    with pytest.raises(ValueError, match="cycle_ends.*override_lr_scheduler"):
        build_lr_scheduler(plain, opt).load_state_dict(state)
    resumed = AnnealingLR(opt, build_lr_scheduler(plain, opt).settings, override_lr_scheduler=True)
    resumed.load_state_dict(state)
    assert resumed.settings.cycle_ends == () and resumed.num_iters == 25
    # a checkpoint written before LR cycles existed has none of their keys
    legacy = {k: v for k, v in build_lr_scheduler(plain, opt).state_dict().items()}
    for key in ("cycle_ends", "rewarmup", "cycle_decay"):
        legacy.pop(key)
    build_lr_scheduler(plain, opt).load_state_dict({**legacy, "num_iters": 7})
    checkpoint = AnnealingLR(
        opt, build_lr_scheduler(plain, opt).settings, use_checkpoint_lr_scheduler=True
    )
    checkpoint.load_state_dict(state)
    assert checkpoint.settings.cycle_ends == (20, 40, 60) and checkpoint.get_lr() == old.get_lr()


@pytest.mark.slow
def test_trainer_logs_the_cycled_lr(tmp_path):
    """A real run (one gloo rank): the `lr` of every metrics.jsonl record follows the cycles."""
    import json
    from pathlib import Path

    from tests.distributed import run_distributed
    from tests.tiny import tiny_settings
    from tests.unit.training.test_lr_neox import _train_one_rank

    settings = tiny_settings(
        tmp_path, train_iters=12, lr_cycles=[6], warmup=2, lr_rewarmup=2, min_lr=MIN,
        lr_decay_style="cosine", optimizer={"type": "Adam", "params": {"lr": PEAK}},
        eval_interval=0, do_test=False, save=None, load=None,
    )  # fmt: skip
    run_distributed(_train_one_rank, 1, settings)
    lines = Path(tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    train = [json.loads(s) for s in lines if s.strip() and "split" not in json.loads(s)]
    assert [r["iteration"] for r in train] == list(range(1, 13))
    for r in train:
        expected = levanter_lr(
            r["iteration"], [0, 6, 12], warmup=2, rewarmup=2, decay=None, shape=optax_cosine
        )
        assert r["lr"] == pytest.approx(expected, rel=1e-9), r
