"""Loading checkpoint files without letting them run code.

A `.pt` file is a pickle: unpickled freely, a downloaded checkpoint could call any function
(`os.system`, ...). Every checkpoint file this trainer and its tools read is loaded with
`torch.load(weights_only=True)`, which builds only tensors, plain Python containers and
numbers, and the few other types `_safe_globals()` lists: the non-tensor objects our own
checkpoints hold (DeepSpeed's loss scaler, ZeRO stage and parameter-fragment records in its
optimizer files; NumPy's RNG state array in `rng_state_rank{R}.pt`).

DeepSpeed's `engine.load_checkpoint` calls `torch.load(..., weights_only=False)` itself (its
`TorchCheckpointEngine.load`, and a few direct calls for universal checkpoints);
`weights_only_loading()` covers those too: inside it, torch's documented
`TORCH_FORCE_WEIGHTS_ONLY_LOAD` switch makes every `torch.load` weights-only, and
`use_safe_loading(engine)` routes DeepSpeed's checkpoint engine through `load_file`, so a
refused file is named in the error.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
from pathlib import Path

import numpy as np
import torch

FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WEIGHTS_ONLY = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
_GLOBAL = re.compile(r"GLOBAL (\S+)")


def _safe_globals() -> list:
    """The non-tensor types our checkpoints hold; each only stores plain fields (no code runs
    when one is rebuilt)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    reconstruct = np._core.multiarray._reconstruct
    return [
        LossScaler,
        DynamicLossScaler,
        ZeroStageEnum,
        fragment_address,
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),
        (reconstruct, "numpy._core.multiarray._reconstruct"),
        (reconstruct, "numpy.core.multiarray._reconstruct"),  # files written by NumPy 1.x
    ]


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds a pickled object that is not on the allow-list."""


def refusal(path, error: Exception) -> UnsafeCheckpointError:
    """The error that names the file and the refused object, from torch's unpickling error."""
    found = _GLOBAL.search(str(error))
    what = f"a pickled Python object ({found.group(1)})" if found else "a pickled Python object"
    return UnsafeCheckpointError(
        f"refused to load checkpoint file '{path}': it holds {what} that is neither a tensor "
        "nor one of the types this trainer's checkpoints contain, and unpickling it could run "
        "arbitrary code. A checkpoint written by this trainer never holds one: the file was "
        "altered or comes from elsewhere; do not load it unless you trust its source"
    )


@contextlib.contextmanager
def weights_only_loading():
    """Within: every `torch.load`, DeepSpeed's included, is weights-only with `_safe_globals()`."""
    saved = {key: os.environ.pop(key, None) for key in (FORCE_WEIGHTS_ONLY, FORCE_NO_WEIGHTS_ONLY)}
    os.environ[FORCE_WEIGHTS_ONLY] = "1"
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def load_file(path, map_location="cpu", *, mmap: bool = False):
    """`torch.load` of one checkpoint file, weights-only with our allow-list (`mmap`: tensors
    mapped, not read, for looking at names and shapes only)."""
    try:
        with weights_only_loading():
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise refusal(path, err) from err


def use_safe_loading(engine) -> None:
    """Make a DeepSpeed engine's checkpoint engine load every file through `load_file`."""
    checkpoint_engine = getattr(engine, "checkpoint_engine", None)
    if checkpoint_engine is None:
        return

    def load(path, map_location=None):
        return load_file(Path(path), map_location=map_location)

    checkpoint_engine.load = load
