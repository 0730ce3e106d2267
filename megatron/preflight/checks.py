"""The modules whose checks `run_preflight` runs; importing one registers its checks."""

from megatron.preflight import (  # noqa: F401
    build_locks,
    checkpoints,
    cpu_bf16,
    datasets,
    disk,
    hosts,
    samples,
    tokenizer,
)
