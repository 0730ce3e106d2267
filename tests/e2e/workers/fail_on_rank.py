"""A worker with a bug on the last rank, started through `deepy.py` like train.py.

Every rank joins the process group; the last rank then raises a RuntimeError (a bug, not a
user error) while the others wait for it in a barrier, which breaks when it exits. Wrapped
in `run_worker` as the real entry points are, so the test sees what a person would: the
bug's traceback once, and nothing from the ranks that were only waiting.
"""

import torch.distributed as dist

from megatron.config import config_from_argv
from megatron.errors import run_worker
from megatron.launcher import init_distributed, setup_distributed_env


def main(argv: list[str]) -> None:
    cfg = config_from_argv(argv)
    env = setup_distributed_env(cfg.launcher)
    init_distributed(cfg.parallel.distributed_backend)
    dist.barrier()
    if env.rank == env.world_size - 1:
        raise RuntimeError(f"deliberate bug on rank {env.rank}")
    dist.barrier()  # never completes: the last rank has stopped


if __name__ == "__main__":
    run_worker(main)
