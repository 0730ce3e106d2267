"""GPT-NeoX's own Mamba configs (`configs/mamba/mamba-{130M,370M,790M,1.4B,2.8B}.yml`, kept
as `tests/data/configs/mamba-*-neox.yml`) through `deepy.py`, at a CPU size.

Each file is passed unchanged; `--set` shrinks the model and turns off what needs a GPU (the
kernels, fp16, NCCL), as a user would on a laptop; a second file gives only the keys the NeoX
file does not set (data, tokenizer, logging). The run trains a few iterations of the
Mamba-only model on one CPU rank (plain engine, ZeRO-1 and activation checkpointing as the
file asks) and its loss falls.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.distributed import free_port
from tests.e2e.test_train_deepy import REPO, _finish, _train_losses
from tests.tiny import tiny_settings, write_config

pytestmark = pytest.mark.slow
SIZES = ["130M", "370M", "790M", "1.4B", "2.8B"]
CPU_SIZE = [
    "num_layers=2",
    "hidden_size=32",
    "num_attention_heads=4",
    "seq_length=32",
    "max_position_embeddings=32",
    'attention_config=[[["mamba"], 2]]',
    "mamba_selective_scan_fusion=false",
    "mamba_causal_conv_fusion=false",
    "mamba_inner_func_fusion=false",
    "fp16.enabled=false",
    "distributed_backend=gloo",
    "train_iters=4",
    "lr_decay_iters=4",
    "optimizer.params.lr=0.003",
    "checkpoint_factor=4",
    "eval_interval=4",
    "eval_iters=1",
    "log_interval=1",
]


@pytest.mark.parametrize("size", SIZES)
def test_neox_mamba_config_trains_at_cpu_size(tmp_path, size):
    neox_file = REPO / "tests" / "data" / "configs" / f"mamba-{size}-neox.yml"
    neox_keys = set(yaml.safe_load(neox_file.read_text()))
    ours = tiny_settings(tmp_path, master_port=free_port(), num_gpus=1)
    rest = write_config(tmp_path, {k: v for k, v in ours.items() if k not in neox_keys})
    sets = [word for item in CPU_SIZE for word in ("--set", item)]
    proc = subprocess.Popen(
        [sys.executable, "deepy.py", "train.py", str(neox_file), str(rest), *sets],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = _finish(proc)
    losses = _train_losses(Path(tmp_path))
    assert sorted(losses) == list(range(1, 5)), out[-3000:]
    assert losses[4] < losses[1], losses
    assert (tmp_path / "ckpt" / "global_step4" / "complete").is_file()
