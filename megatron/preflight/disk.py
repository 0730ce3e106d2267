"""Pre-flight check of `save`: writable, and room for a few checkpoints of this model.

One checkpoint's size is `checkpoint_size(cfg)` (`megatron/checkpoint/size.py`: the
parameter count times the bytes of the weights, of the fp32 master copy and of the optimizer's
states), the same estimate the run checks before each save. The free space is that of the file
system `save` lives on. Below one checkpoint the launch is refused; below `checkpoints_wanted`
(`keep_last_n_checkpoints + 1`: the newest are kept and the next one is written before the
oldest goes; 3 when every checkpoint is kept) it warns. Nothing is created: a missing `save`
is checked through its nearest existing parent, where the run would create it.
"""

from __future__ import annotations

import os
from pathlib import Path

from megatron.checkpoint.size import (
    checkpoint_size,
    existing_ancestor,
    format_bytes,
    free_bytes_at,
)
from megatron.config import Config
from megatron.config.resolve import is_training_script
from megatron.preflight.findings import ERROR, OK, WARNING, Finding, register

NAME = "save"
CHECKPOINTS_WHEN_ALL_KEPT = 3


def checkpoints_wanted(keep_last_n: int | None) -> int:
    """How many checkpoints `save` should have room for before the launch goes on quietly."""
    return keep_last_n + 1 if keep_last_n else CHECKPOINTS_WHEN_ALL_KEPT


def writable_problem(save: str) -> str | None:
    """Why the run could not write checkpoints under `save`, or None."""
    path = Path(save)
    base = existing_ancestor(path)
    if not base.is_dir():
        where = "" if base == path.absolute() else f" cannot be created: '{base}'"
        return (
            f"save folder '{save}'{where} is a file, not a folder; move the file away or set "
            "save to a folder path"
        )
    if not os.access(base, os.W_OK | os.X_OK):
        what = "folder" if base == path.absolute() else f"folder (its parent '{base}')"
        return (
            f"save {what} '{save}' is not writable by this user; give write permission or set "
            "save to a folder you can write"
        )
    return None


def _space(cfg: Config) -> Finding:
    save = cfg.checkpointing.save
    if cfg.model.padded_vocab_size is None:  # a dry run whose tokenizer did not load
        note = "checkpoint size not estimated: padded_vocab_size is unknown (no tokenizer)"
        return Finding(NAME, WARNING, note)
    size = checkpoint_size(cfg)
    free = free_bytes_at(save)
    fits = free // size.total if size.total else 0
    wanted = checkpoints_wanted(cfg.checkpointing.keep_last_n_checkpoints)
    text = (
        f"{format_bytes(size.total)} per checkpoint ({size.parameters:,} parameters), "
        f"{format_bytes(free)} free under '{save}' ({fits:,} checkpoint(s))"
    )
    if fits < 1:
        return Finding(
            NAME,
            ERROR,
            f"{text}: not even one checkpoint fits; free space there or set save to a folder "
            f"on a file system with at least {format_bytes(size.total * wanted)} free",
        )
    if fits < wanted:
        return Finding(
            NAME,
            WARNING,
            f"{text}: fewer than {wanted} (keep_last_n_checkpoints + 1, or 3 when all are "
            "kept); the run stops when a save does not fit",
        )
    return Finding(NAME, OK, text)


@register(NAME, reads_worker_files=True)
def check_save(cfg: Config, script: str) -> list[Finding]:
    """`save` (of a training run) is writable and has room for a few checkpoints."""
    save = cfg.checkpointing.save
    if not save or not is_training_script(script):
        return []
    problem = writable_problem(save)
    if problem:
        return [Finding(NAME, ERROR, problem)]
    return [_space(cfg)]
