"""Stop the run, on every rank together, when a checkpoint cannot be saved whole.

    ensure_room(save_dir, tag, needed, free_bytes)       # rank 0 measures, every rank decides
    with stop_on_failure(save_dir, tag, needed, free_bytes):
        ...write this rank's files...

A run that goes on training after its checkpoints failed loses everything since the last good
one (a 7B run lost weeks to a full disk that way). So before each save rank 0 compares the free
space under `save` with the size of one checkpoint (`megatron/checkpoint/size.py`, the
estimate `deepy.py`'s pre-flight uses too) and broadcasts it, and every rank raises
`CheckpointSaveError` together. A save that fails anyway (ENOSPC, a file in the way, a quota)
raises `CheckpointSaveError` on the rank it failed on, naming the folder and the space; that
rank exits non-zero and the launcher (DeepSpeed's, `srun`, `mpirun`) ends the others. `latest`
moves only after the completion marker, which is written after every rank's files, so it stays
on the last complete checkpoint and the failed folder never looks whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch.distributed as dist

from megatron.checkpoint.size import format_bytes
from megatron.parallel.host_values import broadcast_host, world_group


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be saved whole; the run stops (non-zero exit). The disk's state,
    not a bug: a user error to `megatron/errors.py::is_user_error`, so the console shows this
    message alone."""


def _rank0_value(value: int) -> int:
    """Rank 0's `value` on every rank."""
    return int(broadcast_host([value], 0, world_group())[0])


def ensure_room(
    save_dir: str | Path, tag: str, needed: int | None, free_bytes: Callable[[Path], int]
) -> None:
    """Collective: raise `CheckpointSaveError` on every rank when rank 0 sees less than
    `needed` bytes free under `save_dir` (nothing is checked when `needed` is None)."""
    if needed is None or not save_dir:
        return
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    free = _rank0_value(free_bytes(save_dir) if rank0 else 0)
    if free >= needed:
        return
    raise CheckpointSaveError(
        f"not saving checkpoint {Path(save_dir) / tag}: {format_bytes(free)} ({free:,} bytes) "
        f"free under {save_dir}, one checkpoint needs {format_bytes(needed)} ({needed:,} "
        "bytes); the run stops so that training does not go on without checkpoints. Free "
        "space (or lower keep_last_n_checkpoints) and resume; `latest` is unchanged"
    )


@contextmanager
def stop_on_failure(
    save_dir: str | Path, tag: str, needed: int | None, free_bytes: Callable[[Path], int]
) -> Iterator[None]:
    """Turn a failed write of checkpoint `tag` (OSError such as ENOSPC; RuntimeError, which is
    what `torch.save` raises on a full disk) into `CheckpointSaveError` naming the folder and
    the space: the run stops with a non-zero exit instead of training on."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        free = free_bytes(save_dir)
        need = f"; one checkpoint needs {format_bytes(needed)} ({needed:,} bytes)" if needed else ""
        raise CheckpointSaveError(
            f"could not save checkpoint {Path(save_dir) / tag} ({type(err).__name__}: {err}); "
            f"{format_bytes(free)} ({free:,} bytes) free under {save_dir}{need}. The run "
            "stops; `latest` stays on the last complete checkpoint and this folder has no "
            "completion marker"
        ) from err
