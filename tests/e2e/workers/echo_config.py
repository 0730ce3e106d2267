"""A worker that does what train.py does before training: decode the bundle, join the group.

Each rank writes `{save}/rank{R}.json` (the config's `save` folder: the config is the only
channel that reaches workers under every launcher, MPI included) with its rank, world size
and the config it received (so a test can check every rank got the identical, complete
config).
"""

import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist

from megatron.config import config_from_argv
from megatron.launcher import init_distributed, setup_distributed_env

cfg = config_from_argv(sys.argv[1:])
env = setup_distributed_env(cfg.launcher)
init_distributed(cfg.parallel.distributed_backend)
digest = hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()
digests = [None] * dist.get_world_size()
dist.all_gather_object(digests, digest)
total = torch.tensor([1.0])
dist.all_reduce(total)
result = {
    "rank": env.rank,
    "world_size": env.world_size,
    "all_reduce": total.item(),
    "digests": digests,
    "config": cfg.to_dict(),
}
os.makedirs(cfg.checkpointing.save, exist_ok=True)
with open(os.path.join(cfg.checkpointing.save, f"rank{env.rank}.json"), "w") as handle:
    json.dump(result, handle)
dist.destroy_process_group()
