"""The padded vocabulary of a resumed run: its checkpoint's, when the run's tensor-parallel size
divides it.

The config derives `padded_vocab_size` from the tokenizer and the tensor-parallel size
(`make_vocab_size_divisible_by * tp`), so it grows with tp (50304 rows at tp 1, 50432 at tp 2
for GPT-2's 50257 tokens). The padding logits are masked out of the loss (`true_vocab_size`,
`megatron/parallel/cross_entropy.py`), so the number of padding rows does not change what the
model computes. `tools/reshard.py` therefore keeps a checkpoint's padded size when the new tp
divides it, and a run resuming such a checkpoint builds its model with that size, by the one
rule `megatron/config/derive.py::resumed_padded_vocab` (which the pre-flight applies too, so it
does not refuse the checkpoint's shapes). Only the `config.json` of the folder the loader
resumes (`resume_tag`) is read; its padded size then reaches everything built from the config
(model, reference model, checkpoint size, the `config.json` of the run's own checkpoints).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from megatron.checkpoint.folders import CONFIG_FILE, resume_tag
from megatron.config import resumed_padded_vocab

log = logging.getLogger(__name__)


def saved_padded_vocab(load: str | Path | None) -> int | None:
    """`padded_vocab_size` in the `config.json` of the checkpoint `load` resumes, or None (no
    checkpoint, no config, or a `latest` naming a missing folder, which the loader reports)."""
    if not load or not Path(load).is_dir():
        return None
    try:
        tag = resume_tag(load, warn=lambda _: None)  # the loader warns, once
    except FileNotFoundError:
        return None
    path = Path(load) / tag / CONFIG_FILE if tag else None
    if path is None or not path.is_file():
        return None
    return json.loads(path.read_text()).get("padded_vocab_size")


def with_checkpoint_vocab(cfg):
    """`cfg` with the padded vocabulary of the checkpoint in `load` where it is kept (see the
    module docstring), else `cfg` itself."""
    derived = cfg.model.padded_vocab_size
    padded = resumed_padded_vocab(cfg, saved_padded_vocab(cfg.checkpointing.load))
    if padded == derived:
        return cfg
    log.info(
        "padded vocabulary: %d rows, the checkpoint's (the config derives %d at "
        "model_parallel_size %d; padding logits are masked out of the loss, so the number of "
        "padding rows does not change the model's function)",
        padded,
        derived,
        cfg.parallel.model_parallel_size,
    )
    return cfg.replace(padded_vocab_size=padded)
