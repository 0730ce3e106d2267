"""A worker script for `deepy.py`: records what a rank got from the launcher, then exits.

    python deepy.py tests/cluster/env_probe.py run.yml

Each rank writes `{save}/probe-rank{RANK}.json`: its host name, its rank as the launcher set
it, and the environment variables docs/training.md says reach every rank (their values, and for
a secret only a hash of its value).
"""

import hashlib
import json
import os
import socket
from pathlib import Path

from megatron.config.bundle import config_from_argv
from megatron.errors import run_worker
from megatron.launcher.secrets import CARRIED, load_forwarded_secrets

SECRET = "WANDB_API_KEY"


def main(argv: list[str] | None = None) -> None:
    cfg = config_from_argv(argv)
    load_forwarded_secrets()  # what setup_distributed_env does first in every worker
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "?"
    record = {
        "host": socket.gethostname(),
        "rank": rank,
        "carried": {name: os.environ.get(name) for name in CARRIED},
        "secret_sha": hashlib.sha256(os.environ.get(SECRET, "").encode()).hexdigest(),
    }
    folder = Path(cfg.checkpointing.save)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"probe-rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    run_worker(main)
