"""`distributed_timeout_minutes` reaches the process group a worker joins, so a rank whose peer
died fails after that long instead of DeepSpeed's 30 minutes."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.distributed import free_port

REPO = Path(__file__).resolve().parents[3]

# One worker, started as deepy.py's launcher would start it, joining through the product's
# start-up and reporting the timeout its gloo backend was created with.
WORKER = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from megatron.config import config_from_dict
    from megatron.launcher.worker import initialize_distributed

    settings = dict(num_layers=1, hidden_size=8, num_attention_heads=1, seq_length=8,
                    train_micro_batch_size_per_gpu=1, distributed_backend="gloo")
    if sys.argv[1] != "default":
        settings["distributed_timeout_minutes"] = float(sys.argv[1])
    initialize_distributed(config_from_dict(settings, world_size=1))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    print(json.dumps(backend.options._timeout.total_seconds()))
    """
)


def _timeout_seconds(arg: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(
        PYTHONPATH=str(REPO),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
    )
    env.pop("DEEPSPEED_TIMEOUT", None)
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, arg],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arg, seconds", [("default", 600.0), ("2.5", 150.0)])
def test_process_group_timeout_comes_from_the_config(arg, seconds):
    assert _timeout_seconds(arg) == seconds
