"""The modules whose checks `run_preflight` runs; importing one registers its checks."""

from megatron.preflight import checkpoints, datasets, disk, hosts, tokenizer  # noqa: F401
