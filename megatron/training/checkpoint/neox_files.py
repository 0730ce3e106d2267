"""What the engine's checkpoint files hold for GPT-NeoX's tools and loader, beyond DeepSpeed's
own entries (`megatron/checkpoint/neox_layout.py` says why the names differ).

- The plain engine's `module` entry is saved under GPT-NeoX's sequential names and read back
  from them (`sequential_module_names`, `load_module`), so GPT-NeoX's converter reads a
  `pipe_parallel_size: 0` checkpoint as it reads its own.
- Every engine-state file gets GPT-NeoX's `iteration` and `args` and, when RNG states are
  saved, the saving rank's RNG states under GPT-NeoX's names (`client_state`); DeepSpeed
  writes them into the files of data-parallel rank 0, as GPT-NeoX's own save does. Our own
  resume reads `trainer_state.pt` and `rng_state_rank{R}.pt` instead, which hold more; a
  folder GPT-NeoX saved has neither, and its RNG states are read back from these entries
  (`rng_from_client_state`), as GPT-NeoX's `load_checkpoint` restores them (every
  data-parallel rank takes its model-parallel rank's file, whose streams GPT-NeoX keeps equal
  over the data-parallel ranks).
  Every entry loads weights-only (GPT-NeoX's converter reads a plain engine's file with
  torch's default `torch.load`), so NumPy's state is kept as plain Python values.
"""

from __future__ import annotations

import contextlib

from deepspeed.runtime.pipe.module import PipelineModule

from megatron.checkpoint.model_files import migration
from megatron.checkpoint.neox_layout import (
    from_sequential,
    is_sequential,
    neox_entries,
    to_sequential,
)


def is_plain(engine) -> bool:
    """Whether `engine` saves the whole module in its `mp_rank` files (no pipeline)."""
    module = getattr(engine, "module", None)
    return module is not None and not isinstance(module, PipelineModule)


@contextlib.contextmanager
def sequential_module_names(engine):
    """Within: a plain engine's `module` entry is saved under GPT-NeoX's names."""
    if not is_plain(engine):
        yield
        return
    own = engine.module_state_dict
    engine.module_state_dict = lambda *args, **kwargs: to_sequential(own(*args, **kwargs))
    try:
        yield
    finally:
        del engine.module_state_dict  # the class's method again


def load_module(src: dict, dst) -> None:
    """DeepSpeed's `custom_load_fn` for the plain engine: GPT-NeoX's sequential names (ours
    since issue 27) are renamed to the model's own; a state already in them (DeepSpeed's ZeRO-3
    reconstruction from the partitions) loads as it is. Strict, as DeepSpeed's default."""
    if is_sequential(src):
        src = from_sequential(src, tied=dst.args.tied_embeddings)
    elif set(src) - set(dst.state_dict()):  # a checkpoint of ours from before issue 27
        raise ValueError(migration("the checkpoint"))
    dst.load_state_dict(src, strict=True)


def client_state(config_dict: dict | None, iteration: int, rng: dict | None) -> dict:
    """GPT-NeoX's entries of this rank's engine-state file (module docstring); `rng`: this
    rank's `rng_state`, None when RNG states are not saved."""
    out = neox_entries(config_dict, iteration)
    if rng is not None:
        out.update(
            random_rng_state=rng["python"],
            np_rng_state=_plain_numpy_state(rng["numpy"]),
            torch_rng_state=rng["torch"],
            rng_tracker_states=rng["tracker"],
        )
        if rng["cuda"] is not None:  # its own device's state only, as GPT-NeoX keeps
            out["cuda_rng_state"] = rng["cuda"]
    return out


def rng_from_client_state(client: dict | None) -> dict | None:
    """GPT-NeoX's RNG entries of an engine-state file as `rng_state` holds them (None where it
    saved none: `no_save_rng`, or a file of ours without RNG)."""
    if not client or "torch_rng_state" not in client:
        return None
    return {
        "python": client["random_rng_state"],
        "numpy": tuple(client["np_rng_state"]),
        "torch": client["torch_rng_state"],
        "cuda": client.get("cuda_rng_state"),
        "tracker": client.get("rng_tracker_states"),
    }


def _plain_numpy_state(state: tuple) -> tuple:
    """`np.random.get_state()` with its key array as a list (`np.random.set_state` takes it)."""
    name, keys, *rest = state
    return (name, keys.tolist(), *rest)
