"""Optimizers: each trains a small problem; Lion/SM3/MADGRAD match hand-computed steps."""

from __future__ import annotations

import math

import pytest
import torch

from megatron.config.groups.optimizer import OPTIMIZER_TYPES
from megatron.model.param_groups import param_groups
from megatron.training.optim import MADGRAD, SM3, Lion, OneBitAdam
from megatron.training.optim.optimizers import (
    OPTIMIZERS,
    build_optimizer,
    build_optimizer_from_config,
)

# Per-type learning rates that make 40 steps on the toy problem clearly useful.
TRAINABLE = {
    "Adam": 0.05,
    "AdamW": 0.05,
    "CPU_Adam": 0.05,
    "CPU_torch_adam": 0.05,
    "Lion": 0.01,
    "SGD": 0.05,
    "SM3": 0.1,
    "madgrad_wd": 0.02,
    "OneBitAdam": 0.05,
    "Distro": 0.02,
}
PARAMS = {"OneBitAdam": {"freeze_step": 10}}


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.out = torch.nn.Linear(4, 1, bias=False)

    def forward(self, x):
        return self.out(self.norm(self.lin(x)))


def _loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


@pytest.mark.parametrize("kind", sorted(TRAINABLE))
def test_each_optimizer_decreases_the_loss(kind):
    torch.manual_seed(0)
    model = Toy()
    x = torch.randn(64, 8)
    y = x[:, :1] * 2.0 - x[:, 1:2]
    opt = build_optimizer(param_groups(model, 0.01), kind, TRAINABLE[kind], 0.01, PARAMS.get(kind))
    first = _loss(model, x, y).item()
    for _ in range(40):
        opt.zero_grad()
        _loss(model, x, y).backward()
        opt.step()
    assert _loss(model, x, y).item() < 0.5 * first
    assert set(OPTIMIZERS) == set(TRAINABLE)


def test_every_type_of_the_config_table_has_one_builder():
    assert set(OPTIMIZERS) == set(OPTIMIZER_TYPES)


def test_zero_tested_types_are_those_deepspeed_lists():
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    for kind, facts in OPTIMIZER_TYPES.items():
        weight = torch.nn.Parameter(torch.zeros(4))
        opt = build_optimizer([{"params": [weight]}], kind, 1e-3, 0.0, PARAMS.get(kind))
        assert (type(opt) in ZERO_SUPPORTED_OPTIMIZERS) == facts.zero_tested, kind


def test_no_weight_decay_on_biases_and_norms():
    model = Toy()
    model.out.weight.no_weight_decay = True
    groups = {g["name"]: g for g in param_groups(model, 0.1)}
    assert groups["decay"]["params"] == [model.lin.weight]
    assert groups["decay"]["weight_decay"] == 0.1
    assert {id(p) for p in groups["no_decay"]["params"]} == {
        id(model.lin.bias),
        id(model.norm.weight),
        id(model.norm.bias),
        id(model.out.weight),
    }
    assert groups["no_decay"]["weight_decay"] == 0.0


def _step(opt, p, grad):
    p.grad = torch.tensor(grad, dtype=p.dtype)
    opt.step()


def test_lion_matches_hand_computed_steps():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.1)
    _step(opt, p, [0.5, -0.1])
    # decay 1 - 0.01, then minus lr × sign(0.1 g)
    assert p.tolist() == pytest.approx([0.99 - 0.1, -1.98 + 0.1])
    assert opt.state[p]["exp_avg"].tolist() == pytest.approx([0.005, -0.001])
    _step(opt, p, [-0.01, 0.02])
    # sign(0.9 m + 0.1 g) = sign([0.0035, 0.0011]) = [+1, +1]: momentum outvotes the gradient
    assert p.tolist() == pytest.approx([0.89 * 0.99 - 0.1, -1.88 * 0.99 - 0.1])


def test_sm3_matches_hand_computed_steps():
    p = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))
    opt = SM3([p], lr=1.0)
    _step(opt, p, [[1.0, 2.0], [3.0, 4.0]])
    # nu = g², so the update is g / |g| = 1 everywhere
    assert p.flatten().tolist() == pytest.approx([-1.0, -1.0, -1.0, -1.0])
    rows, cols = opt.state[p]["accumulators"]
    assert rows.flatten().tolist() == [4.0, 16.0]  # max over each row of nu
    assert cols.flatten().tolist() == [9.0, 16.0]  # max over each column of nu
    _step(opt, p, [[1.0, 1.0], [1.0, 1.0]])
    # nu = min(row_i, col_j) + 1 = [[5, 5], [10, 17]]
    expected = [-1 - 5**-0.5, -1 - 5**-0.5, -1 - 10**-0.5, -1 - 17**-0.5]
    assert p.flatten().tolist() == pytest.approx(expected)
    assert rows.flatten().tolist() == [5.0, 17.0]
    assert cols.flatten().tolist() == [10.0, 17.0]


def test_sm3_vector_is_adagrad_with_momentum():
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = SM3([p], lr=0.5, momentum=0.5)
    _step(opt, p, [3.0, -4.0])
    # update = g/|g| = [1, -1]; momentum buffer = 0.5 × update
    assert p.tolist() == pytest.approx([-0.25, 0.25])
    _step(opt, p, [4.0, 3.0])
    # nu = [25, 25]: update [0.8, 0.6]; buffer = 0.5 × [0.5, -0.5] + 0.5 × [0.8, 0.6]
    assert p.tolist() == pytest.approx([-0.25 - 0.5 * 0.65, 0.25 - 0.5 * 0.05])


def test_madgrad_matches_hand_computed_steps():
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = MADGRAD([p], lr=0.1, momentum=0.9, eps=0.0, weight_decay=0.5)
    _step(opt, p, [2.0])
    # lamb = 0.1: s = 0.2, nu = 0.4, z = 1 - 0.2 / 0.4^(1/3); decay first, then average
    z = 1.0 - 0.2 / 0.4 ** (1 / 3)
    p1 = 0.9 * (1.0 * (1 - 0.05)) + 0.1 * z
    assert p.item() == pytest.approx(p1, rel=1e-12)
    _step(opt, p, [1.0])
    lamb = 0.1 * math.sqrt(2)
    z = 1.0 - (0.2 + lamb) / (0.4 + lamb) ** (1 / 3)
    assert p.item() == pytest.approx(0.9 * (p1 * 0.95) + 0.1 * z, rel=1e-12)


def test_unknown_params_name_the_optimizer():
    with pytest.raises(ValueError, match="do not fit optimizer.type 'SM3'"):
        build_optimizer(param_groups(Toy(), 0.0), "SM3", 0.1, 0.0, {"betas": [0.9, 0.9]})
    with pytest.raises(ValueError, match="expected one of"):
        build_optimizer(param_groups(Toy(), 0.0), "Adagrad", 0.1)


def test_from_config_passes_params_and_lr(make_config):
    cfg = make_config(
        optimizer={"type": "Lion", "params": {"lr": 3.0e-4, "betas": [0.95, 0.98]}},
        weight_decay=0.2,
    )
    opt, groups = build_optimizer_from_config(cfg, Toy())
    assert isinstance(opt, Lion) and opt.param_groups is not groups
    assert [g["weight_decay"] for g in opt.param_groups] == [0.2, 0.0]
    assert opt.param_groups[0]["betas"] == (0.95, 0.98)
    assert opt.param_groups[0]["lr"] == 3.0e-4


def test_onebitadam_is_ours_and_reads_the_config(make_config):
    params = {"lr": 1.0e-3, "freeze_step": 2, "cuda_aware": False, "comm_backend_name": "nccl"}
    cfg = make_config(optimizer={"type": "OneBitAdam", "params": params})
    opt, _ = build_optimizer_from_config(cfg, Toy())
    assert isinstance(opt, OneBitAdam) and opt.freeze_step == 2
