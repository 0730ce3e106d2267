"""Pre-flight of a training run's `load` folder, file by file: the weight files hold the model
the config builds, at the run's layout.

`megatron/preflight/checkpoints.py` compares the folder's `config.json` with the config; a
folder GPT-NeoX wrote has none, and a folder may lack a file its `config.json` promises. Here
the files themselves are read (names and shapes only: tensors are memory-mapped, not read) and
compared with `ModelSchema`'s parameters as each tensor-parallel rank holds them: every layer
file the pipeline engine opens (`megatron/checkpoint/model_files.py::expected_layer_files`),
or the plain engine's `module` entries; GPT-NeoX's names and layouts are read as the model's
layers read them (`megatron/model/neox_names.py`). The first problems are named, with the
file and what would fix it. A folder in our numbering from before issue 27 is named with the
`tools/reshard.py` command that migrates it (`checkpoints.py` builds the command).
"""

from __future__ import annotations

from pathlib import Path

import torch

from megatron.checkpoint.deepspeed_files import mp_rank_file
from megatron.checkpoint.model_files import expected_layer_files, has_old_numbering, layer_files_in
from megatron.checkpoint.neox_layout import from_sequential, is_sequential
from megatron.checkpoint.safe_load import load_file
from megatron.checkpoint_tools.schema import ModelSchema
from megatron.model import ModelArgs
from megatron.model.neox_names import from_neox

SHOWN = 4
"""Problems named in the message (the rest are counted)."""


def _local_shape(spec, tp: int) -> tuple[int, ...]:
    shape = list(spec.shape)
    if spec.partition_dim is not None:
        shape[spec.partition_dim] //= tp
    return tuple(shape)


def _as_ours(state: dict, args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """`{name: shape}` of a saved state as our layers read it (shapes only, on `meta`)."""
    meta = {k: torch.empty(v.shape, device="meta") for k, v in state.items() if torch.is_tensor(v)}
    return {k: tuple(v.shape) for k, v in from_neox(meta, args).items()}


def _compare(where: str, saved: dict, wanted: dict) -> list[str]:
    out = [f"{where} lacks '{n}' {s}" for n, s in wanted.items() if n not in saved]
    out += [f"{where} holds '{n}', which this model has not" for n in saved if n not in wanted]
    out += [
        f"{where}: '{n}' is {saved[n]}, this model's is {s}"
        for n, s in wanted.items()
        if n in saved and saved[n] != s
    ]
    return out


def is_old_numbering(folder: Path, pipeline: bool) -> bool:
    """Whether `folder` holds our numbering from before issue 27 (`model_files.py`)."""
    if pipeline:
        return has_old_numbering(folder)
    path = folder / mp_rank_file(0)
    module = load_file(path, mmap=True).get("module") if path.is_file() else None
    return bool(module) and not is_sequential(module)


def file_problems(folder: Path, args: ModelArgs, tp: int, pipeline: bool) -> list[str]:
    """What in `folder`'s weight files does not fit the model `args` at tensor-parallel size
    `tp` (empty: every file the engine opens holds this model's tensors)."""
    schema = ModelSchema(args)
    if not pipeline:
        problems = []
        for t in range(tp):
            module = load_file(folder / mp_rank_file(t), mmap=True).get("module") or {}
            if not is_sequential(module):  # ZeRO-3 keeps no module here
                continue
            saved = _as_ours(from_sequential(module, args.tied_embeddings), args)
            wanted = {n: _local_shape(s, tp) for n, s in schema.params.items()}
            problems += _compare(f"{mp_rank_file(t)} (module)", saved, wanted)
        return problems
    present, problems = layer_files_in(folder), []
    expected = {n for names in expected_layer_files(args, tp).values() for n in names}
    extra = sorted(present - expected)
    if extra:  # first: it says most about another model
        problems.append(f"{', '.join(extra[:SHOWN])} hold layers this model does not build")
    for index, names in expected_layer_files(args, tp).items():
        specs = schema.layer_params(index)
        for name in names:
            if name not in present:
                part = specs[0].local if specs else "a layer"
                problems.append(f"{name} is missing (layer {index}: {part}, ...)")
                continue
            saved = _as_ours(load_file(folder / name, mmap=True), args)
            wanted = {s.local: _local_shape(s, tp) for s in specs}
            problems += _compare(name, saved, wanted)
    return problems


def describe(problems: list[str]) -> str:
    shown = "; ".join(problems[:SHOWN])
    more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
    return shown + more
