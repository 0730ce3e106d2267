import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def write(tmp_path):
    """Write a config file under tmp_path and return its path."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write


MINIMAL = """
num_layers: 2
hidden_size: 64
num_attention_heads: 4
seq_length: 32
train_micro_batch_size_per_gpu: 2
optimizer: {type: Adam, params: {lr: 0.001}}
train_iters: 10
"""
