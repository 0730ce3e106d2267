"""The config bundle: the resolved config as one shell-safe argument for every worker.

`deepy.py` resolves the config once and passes it to each worker as base64-encoded JSON
(`--megatron_config <b64>`): only `[A-Za-z0-9_-=]`, so it survives any shell, pdsh, MPI or
`srun` argument passing. `--megatron_config_file PATH` reads the same JSON from a file.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

from megatron.config.config import Config

BUNDLE_FLAG = "--megatron_config"
BUNDLE_FILE_FLAG = "--megatron_config_file"


def encode_bundle(cfg: Config) -> str:
    data = json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(data).decode("ascii")


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
    return Config.from_dict(json.loads(Path(args.bundle_file).read_text()))
