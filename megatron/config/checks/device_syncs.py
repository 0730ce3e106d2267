"""Switches that make the device wait without changing any result: honoured, warned about.

`synchronize_each_layer` (GPT-NeoX's, set by most of its shipped configs) makes DeepSpeed's
activation checkpointing call the accelerator's `synchronize()` at the start and end of each
checkpointed chunk's forward and of its backward: `SYNCS_PER_CHUNK` waits for the whole device
per chunk per micro-batch. A wait computes nothing, so the key cannot change a loss, a
gradient or a metric; it only makes a run slower, which a config file should not do silently.
"""

from __future__ import annotations

import math

from megatron.config.config import Config

SYNCS_PER_CHUNK = 4  # forward start and end, backward start and end (DeepSpeed 0.19)


def synchronisations_per_micro_batch(cfg: Config) -> int:
    """Device synchronisations `synchronize_each_layer` adds to each micro-batch (all stages)."""
    m = cfg.model
    if not (m.synchronize_each_layer and m.checkpoint_activations):
        return 0
    return SYNCS_PER_CHUNK * math.ceil(m.num_layers / m.checkpoint_num_layers)


def warn_device_syncs(cfg: Config, sources: dict[str, str], warn: list[str]) -> None:
    """One warning when `synchronize_each_layer` is on, saying what it costs and how to stop."""
    m = cfg.model
    if not m.synchronize_each_layer:
        return
    key = f"config key 'synchronize_each_layer' ({sources.get('synchronize_each_layer')})"
    if not m.checkpoint_activations:
        warn.append(f"{key} has no effect without checkpoint_activations: true")
        return
    warn.append(
        f"{key} makes DeepSpeed's activation checkpointing synchronise "
        f"the whole device {SYNCS_PER_CHUNK} times per checkpointed chunk of "
        f"{m.checkpoint_num_layers} layer(s) per micro-batch "
        f"({synchronisations_per_micro_batch(cfg)} per micro-batch here); it cannot change any "
        "result, only slow the run: set synchronize_each_layer: false to turn it off"
    )
