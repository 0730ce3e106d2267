"""DeepSpeed's shared-memory all-reduce buffers on CPU: removed as soon as every rank has them.

On a machine without GPUs, `deepspeed.init_distributed` makes one POSIX shared-memory file per
local rank, `/dev/shm/deepspeed_allreduce_buffer_{uid}_{MASTER_ADDR}_{MASTER_PORT}_{rank}`, and
each rank maps every other rank's file while it initialises. DeepSpeed never removes them, so
every CPU run used to leave its buffers in memory after it ended (tens of MB per rank, for as
long as the machine is up; a day of test runs filled 22 GB). Once all ranks are past
initialisation the names are no longer needed: the mappings stay valid after the name is
unlinked, exactly like an open file. `release_own_buffer` (called by `init_distributed`) waits
for every rank, then unlinks this rank's name, so nothing is left even if the run is killed
later. `remove_buffers` clears every rank's names of one rendezvous (for a parent process whose
workers may have died during initialisation).
"""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer"


def buffer_name(addr: str, port: str | int, rank: int | str, uid: int | None = None) -> str:
    """DeepSpeed's name of `rank`'s buffer (its `shm.cpp` format: prefix_uid_addr_port_rank)."""
    return f"{PREFIX}_{os.getuid() if uid is None else uid}_{addr}_{port}_{rank}"


def release_own_buffer(group=None) -> bool:
    """After every rank of `group` reached this point, unlink this rank's buffer name.

    Returns whether a buffer was found and removed (False where DeepSpeed made none: GPUs,
    ranks on several machines, or a DeepSpeed without the shared-memory op)."""
    import torch.distributed as dist

    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    path = SHM_DIR / buffer_name(addr, port, dist.get_rank())
    dist.barrier(group=group)  # every rank has mapped every buffer by now
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def remove_buffers(addr: str, port: str | int) -> list[Path]:
    """Unlink every rank's buffer name of the rendezvous at `addr:port`; the names removed."""
    found = sorted(SHM_DIR.glob(f"{buffer_name(addr, port, '*')}"))
    for path in found:
        path.unlink(missing_ok=True)
    return found
