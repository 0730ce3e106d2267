"""The optimizer state a plan counts is the optimizer's own, stepped on `meta`: per fp32
element, Adam's two moments (Kingma & Ba 2015) plus a step counter per tensor, Lion's one
momentum (Chen et al. 2023), 1-bit Adam's moments and two error-feedback buffers (Tang et al.
2021), and SM3's one accumulator per row and per column of a matrix (Anil et al. 2019), not a
tensor of its size."""

from __future__ import annotations

import pytest

from megatron.planning.states import optimizer_state_bytes

R, C = 64, 32
SHAPES = [[(R, C), (C,)]]  # a matrix and a vector
N = R * C + C


@pytest.mark.parametrize("optimizer,expected", [
    ("Adam", 2 * 4 * N + 2 * 4),  # exp_avg, exp_avg_sq; a float32 step per tensor
    ("Lion", 4 * N),
    ("OneBitAdam", 4 * 4 * N),
    ("SM3", 4 * (R + C) + 4 * C),  # a vector has one accumulator of its size
    ("CPU_Adam", 2 * 4 * N),  # DeepSpeed's C++ Adam: its two moments, from the table
])  # fmt: skip
def test_state_bytes(optimizer, expected):
    assert optimizer_state_bytes(optimizer, {}, SHAPES) == expected
