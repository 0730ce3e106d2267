"""The config bundle: the resolved config as one shell-safe argument for every worker.

`deepy.py` resolves the config once and passes it to each worker as base64-encoded JSON
(`--megatron_config <b64>`): only `[A-Za-z0-9_-=]`, so it survives any shell, pdsh, MPI or
`srun` argument passing. `--megatron_config_file PATH` reads the same JSON from a file: a
bundle longer than `INLINE_LIMIT` (muP's base shapes make 50 KB at 80 layers; Linux takes
128 KiB in one argument, and pdsh and srun pass the whole command through a remote shell)
travels so, in a file `deepy.py` has the launcher write in its launch folder.
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
from pathlib import Path

from megatron.config.config import Config
from megatron.config.schema import ConfigError

BUNDLE_FLAG = "--megatron_config"
BUNDLE_FILE_FLAG = "--megatron_config_file"
INLINE_LIMIT = 32 * 1024
"""The longest bundle passed on the command line, in characters."""


def bundle_json(cfg: Config) -> str:
    return json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":"))


def encode_bundle(cfg: Config) -> str:
    return base64.urlsafe_b64encode(bundle_json(cfg).encode()).decode("ascii")


def decode_bundle(text: str) -> Config:
    return Config.from_dict(json.loads(base64.urlsafe_b64decode(text.encode("ascii"))))


def config_from_argv(argv: list[str] | None = None) -> Config:
    """Parse a worker's command line (`--megatron_config` or `--megatron_config_file`)."""
    parser = argparse.ArgumentParser(description="megatron worker")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument(BUNDLE_FLAG, dest="bundle", help="base64 JSON config bundle from deepy.py")
    group.add_argument(BUNDLE_FILE_FLAG, dest="bundle_file", help="JSON config bundle file")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    args, _unknown = parser.parse_known_args(argv)
    if args.bundle is not None:
        return decode_bundle(args.bundle)
    path = Path(args.bundle_file)
    if not path.is_file():
        raise ConfigError(
            f"{BUNDLE_FILE_FLAG} {path}: no such file on {socket.gethostname()}; deepy.py "
            "writes it in its launch folder (.megatron_launch/ in the working directory), "
            "which must be on a file system every node sees"
        )
    return Config.from_dict(json.loads(path.read_text()))
