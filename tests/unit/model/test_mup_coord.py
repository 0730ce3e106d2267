"""muP's coordinate check on the numbers (Tensor Programs V, section 7.3): after a few Adam
steps, activation sizes grow with the width in the standard parametrisation and stay flat
under muP."""

from __future__ import annotations

import pytest

from megatron.model.args import ModelArgs
from megatron.model.mup_coord import coord_data

BASE = ModelArgs(num_layers=2, hidden_size=16, num_attention_heads=2, vocab_size=64, seq_length=16)
WIDTHS = [16, 64, 256]


@pytest.fixture(scope="module")
def data():
    return {mup: coord_data(BASE, WIDTHS, mup=mup, lr=1e-2, steps=4) for mup in (False, True)}


def growth(sizes: dict, module: str) -> float:
    """Widest over narrowest, after the last step."""
    return sizes[WIDTHS[-1]][module][-1] / sizes[WIDTHS[0]][module][-1]


@pytest.mark.parametrize("module", ["layer 2", "layer 3", "logits"])
def test_standard_parametrisation_blows_up_with_width(data, module):
    assert growth(data[False], module) > 4


@pytest.mark.parametrize("module", ["layer 2", "layer 3", "logits"])
def test_mup_keeps_activation_sizes_flat_across_widths(data, module):
    assert 0.5 < growth(data[True], module) < 1.5
