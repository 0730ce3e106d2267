"""`init_distributed` on CPU leaves none of DeepSpeed's shared-memory buffers behind.

Two worker processes start the way the DeepSpeed runner starts them (RANK, LOCAL_SIZE, ...,
as `deepy.py` launches) and call the product's `init_distributed`. DeepSpeed creates one
`/dev/shm/deepspeed_allreduce_buffer_*` file per rank and never removes it; after
`init_distributed` returns no name of this rendezvous is left, and DeepSpeed's shared-memory
all-reduce still sums correctly through the mappings it already holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.distributed import free_port

WORKER = """
import json, os, torch
from pathlib import Path
from megatron.launcher.distributed import init_distributed
init_distributed()
import deepspeed.comm as dcomm
torch.distributed.barrier()  # every rank has returned from init_distributed
port = os.environ["MASTER_PORT"]
left = sorted(p.name for p in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
values = torch.full((4096,), float(int(os.environ["RANK"]) + 1))
dcomm.inference_all_reduce(values)  # DeepSpeed's shared-memory path on CPU
print(json.dumps({"left": left, "sum": values.unique().tolist()}))
"""


def test_no_buffer_name_is_left_and_the_all_reduce_still_works():
    port = free_port()
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    base.update(WORLD_SIZE="2", LOCAL_SIZE="2", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    root = Path(__file__).resolve().parents[2]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER],
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for out in outputs:
        found = json.loads(out.strip().splitlines()[-1])
        assert found == {"left": [], "sum": [3.0]}
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
