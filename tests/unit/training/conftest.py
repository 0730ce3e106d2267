"""Shared helpers of the training unit tests: a tiny resolved config."""

from __future__ import annotations

import pytest

from megatron.config import config_from_dict

TINY = dict(
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    seq_length=32,
    train_micro_batch_size_per_gpu=2,
    train_iters=200,
    optimizer={"type": "Adam", "params": {"lr": 1.0e-3}},
)


def tiny_config(**changes):
    """A resolved config of a 2-layer, 64-wide model; `changes` are flat config keys."""
    return config_from_dict({**TINY, **changes}, vocab_size=100, world_size=1)


@pytest.fixture
def make_config():
    return tiny_config
