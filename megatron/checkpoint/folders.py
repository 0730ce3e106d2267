"""Checkpoint folders: their names, `latest`, completion markers, which one a resume takes, pruning.
Pure file-system rules, shared by the training loop
(`megatron/training/checkpoint/checkpoint_io.py`), the checkpoint tools and the pre-flight.

A temporary (time-based) checkpoint has the same files in `{save}/global_step{N}_temporary/`; which
kind is saved when, and when a temporary one goes, is `megatron/training/checkpoint/policy.py`'s
rule.

`{save}/latest` holds the tag (`global_step{N}`) of the newest complete checkpoint. It is
written last, by rank 0, after a barrier that every rank reaches only when its own files are
written, through a temporary file and `os.replace` (atomic on POSIX): a crash mid-save leaves
`latest` at the previous checkpoint. DeepSpeed's own `latest` writing is switched off.

A folder without `complete` (a crash mid-save) is partial: `keep_last_n_checkpoints` neither
counts nor deletes it, and a save into an existing folder first removes its old marker, so a
half-overwritten folder never looks whole. Pruning never deletes the folder `latest` names nor a
permanent one, and a folder it cannot delete is reported, not silently kept. `load` resumes what
`latest` names; when that folder is missing or partial, the newest complete checkpoint of either
kind, with a warning.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

LATEST = "latest"
TRAINER_STATE = "trainer_state.pt"
CONFIG_FILE = "config.json"
COMPLETE = "complete"
PERMANENT = "permanent"
SAVE_KINDS = ("step", "permanent", "temporary")
# DeepSpeed's universal checkpoint (`megatron/checkpoint_tools/universal.py`): a folder with
# this file is restored through DeepSpeed's `load_universal` path.
UNIVERSAL_STATE = "zero/optimizer_state.pt"
TAG = re.compile(r"^global_step(\d+)$")
"""A checkpoint folder's name (`tag_for` a step); group: the iteration."""
_TEMPORARY_TAG = re.compile(r"^global_step(\d+)_temporary$")


def tag_for(iteration: int, kind: str = "step") -> str:
    """The folder name of a checkpoint of `kind` (one of SAVE_KINDS) at `iteration`."""
    if kind not in SAVE_KINDS:
        raise ValueError(f"checkpoint kind '{kind}' is not valid; expected one of {SAVE_KINDS}")
    return f"global_step{iteration}_temporary" if kind == "temporary" else f"global_step{iteration}"


def read_latest(load_dir: str | Path) -> str | None:
    """The tag `latest` names, or None when there is nothing to resume."""
    path = Path(load_dir) / LATEST
    if not path.is_file():
        return None
    tag = path.read_text().strip()
    if not (Path(load_dir) / tag).is_dir():
        raise FileNotFoundError(
            f"{path} names checkpoint '{tag}', but {Path(load_dir) / tag} does not exist; "
            "point it at an existing global_step folder or remove it to start afresh"
        )
    return tag


def write_latest(save_dir: str | Path, tag: str) -> None:
    """Atomically make `latest` name `tag` (temporary file, fsync, os.replace)."""
    save_dir = Path(save_dir)
    tmp = save_dir / f".{LATEST}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(tag)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, save_dir / LATEST)


def list_checkpoints(save_dir: str | Path, complete_only: bool = False) -> list[tuple[int, Path]]:
    """(iteration, folder) of every `global_step{N}` folder, oldest first (`complete_only`:
    only those with the completion marker, and the one `latest` names)."""
    protected = _latest_tag(save_dir)
    found = []
    for path in Path(save_dir).iterdir() if Path(save_dir).is_dir() else ():
        match = TAG.match(path.name)
        if not (match and path.is_dir()):
            continue
        if complete_only and not ((path / COMPLETE).is_file() or path.name == protected):
            continue
        found.append((int(match.group(1)), path))
    return sorted(found)


def temporary_checkpoints(save_dir: str | Path) -> list[tuple[int, Path]]:
    """(iteration, folder) of every temporary checkpoint folder, complete or not, oldest first."""
    root = Path(save_dir)
    found = [(_TEMPORARY_TAG.match(p.name), p) for p in root.iterdir()] if root.is_dir() else []
    return sorted((int(m.group(1)), p) for m, p in found if m and p.is_dir())


def newest_complete(save_dir: str | Path) -> str | None:
    """The tag of the newest (highest iteration) complete checkpoint of either kind; at the
    same iteration a `global_step{N}` folder wins over a temporary one."""
    found = [(it, 1, p) for it, p in list_checkpoints(save_dir) if (p / COMPLETE).is_file()]
    found += [(it, 0, p) for it, p in temporary_checkpoints(save_dir) if (p / COMPLETE).is_file()]
    return max(found)[2].name if found else None


def resume_tag(load_dir: str | Path, warn=None) -> str | None:
    """The checkpoint `load` resumes: the one `latest` names (None without `latest`). When that
    folder is missing or partial, the newest complete one of either kind, passing the reason to
    `warn` (default: the log's warning); a folder without marker is trusted when no folder has
    one (written before markers or by GPT-NeoX). The pre-flight asks this same function."""
    tag = _latest_tag(load_dir)
    if tag is None or (Path(load_dir) / tag / COMPLETE).is_file():
        return tag
    fallback = newest_complete(load_dir)
    if fallback is None:
        return read_latest(load_dir)  # refuses a missing folder, naming it
    state = "partial" if (Path(load_dir) / tag).is_dir() else "missing"
    (warn or log.warning)(
        f"{Path(load_dir) / LATEST} names checkpoint '{tag}', which is {state}; resuming from "
        f"the newest complete checkpoint, '{fallback}', instead"
    )
    return fallback


def _latest_tag(save_dir: str | Path) -> str | None:
    path = Path(save_dir) / LATEST
    return path.read_text().strip() if path.is_file() else None


def prune_checkpoints(save_dir: str | Path, keep: int | None, pinned=()) -> list[Path]:
    """Delete all but the newest `keep` complete `global_step{N}` checkpoints, never the one
    `latest` names nor a folder in `pinned` (e.g. the starting checkpoint a DPO/KTO run's
    reference model is loaded from again on resume); partial, permanent and temporary folders
    are neither counted nor deleted. Returns the folders deleted; one that cannot be deleted
    is reported with a warning naming it and the error."""
    if keep is None:
        return []
    if keep < 1:
        raise ValueError(f"keep_last_n_checkpoints must be >= 1 (or null), got {keep}")
    protected = _latest_tag(save_dir)
    kept = {Path(p).resolve() for p in pinned}
    found = list_checkpoints(save_dir, complete_only=True)
    folders = [path for _, path in found if not (path / PERMANENT).is_file()]
    deleted = []
    for path in folders[:-keep]:
        if path.name == protected or path.resolve() in kept:
            continue
        try:
            shutil.rmtree(path)
        except OSError as err:
            log.warning(
                "keep_last_n_checkpoints: could not delete old checkpoint %s (%s); it still "
                "takes disk space: delete it by hand",
                path,
                err,
            )
        else:
            deleted.append(path)
    return deleted


def mark_complete(folder: Path, tag: str) -> None:
    """Write the completion marker of a checkpoint folder (fsynced before `latest` moves)."""
    with open(folder / COMPLETE, "w") as f:
        f.write(tag)
        f.flush()
        os.fsync(f.fileno())
