"""Where this process sits on its node, as the launcher said: read by the rooms that do per-node
work (the dataset index without a shared file system, old checkpoints' per-device RNG lists).

`megatron/launcher/distributed.py::pin_device` may rewrite LOCAL_RANK to the device index (one
visible GPU per process makes it 0 everywhere, which is what DeepSpeed reads as the device); it
keeps the launcher's value in `NODE_LOCAL_RANK` first.
"""

from __future__ import annotations

import os

NODE_LOCAL_RANK = "MEGATRON_NODE_LOCAL_RANK"


def node_local_rank() -> int:
    """This process's index among its node's processes (LOCAL_RANK as the launcher set it,
    before `pin_device` made it the device index)."""
    return int(os.environ.get(NODE_LOCAL_RANK) or os.environ.get("LOCAL_RANK") or 0)
