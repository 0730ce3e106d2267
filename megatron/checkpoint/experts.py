"""The files of the experts that DeepSpeed's own files do not hold (expert parallelism): their
names, the expert-parallel size a folder was saved with, and reading them back.

`expert_states_pp{P}_ep{r}.pt` holds the experts of expert-parallel rank r > 0 of pipeline
stage P (`megatron/training/checkpoint/experts.py::ExpertCheckpoint` writes them during
training; `tools/reshard.py` and the checkpoint reader read them without an engine):

    {"ep_size": ep, "params": {name: tensor}, "optimizer": {name: {state key: tensor}}}

A checkpoint is resumed at the expert-parallel size it was saved with: another size is
refused before anything is loaded (`check_expert_layout`), since the expert tensors would
not match; `tools/reshard.py --expert-parallel-size N` converts between sizes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from megatron.checkpoint.safe_load import load_file

EP_KEY = "moe_expert_parallel_size"


def expert_file(folder: Path, pp_rank: int, ep_rank: int) -> Path:
    return Path(folder) / f"expert_states_pp{pp_rank}_ep{ep_rank}.pt"


def saved_expert_parallel_size(folder: Path) -> int:
    """The expert-parallel size a checkpoint folder was saved with (its `config.json`; 1 when
    it has none or no MoE)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return 1
    return int(json.loads(path.read_text()).get(EP_KEY, 1) or 1)


def check_expert_layout(folder: Path, ep_size: int) -> None:
    """Refuse to resume a checkpoint saved at another expert-parallel size."""
    saved = saved_expert_parallel_size(folder)
    if saved != ep_size:
        raise ValueError(
            f"{folder} was saved with {EP_KEY} {saved}, this run has {ep_size}: the expert "
            f"tensors of each rank would not match; resume with {EP_KEY}: {saved}, or convert "
            f"it first: python tools/reshard.py --checkpoint {folder.parent} --output NEW_DIR "
            f"--model-parallel-size TP --pipe-parallel-size PP --expert-parallel-size {ep_size}"
        )


def is_expert_name(name: str) -> bool:
    """Whether a parameter name is an expert tensor (stacked `(E/ep, ...)`, `moe.py`)."""
    return ".mlp.experts." in name


def expert_slices(folder: Path, ep_size: int) -> list[dict[str, torch.Tensor]]:
    """`{name: tensor}` of expert-parallel ranks 1 .. ep-1 (all pipeline stages' files)."""
    slices = []
    for ep_rank in range(1, ep_size):
        files = sorted(Path(folder).glob(f"expert_states_pp*_ep{ep_rank}.pt"))
        if not files:
            raise FileNotFoundError(
                f"{folder} was saved with {EP_KEY} {ep_size} but holds no "
                f"expert_states_pp*_ep{ep_rank}.pt: the experts of expert-parallel rank "
                f"{ep_rank} are missing (an incomplete checkpoint)"
            )
        merged: dict[str, torch.Tensor] = {}
        for path in files:
            merged.update(load_file(path)["params"])
        slices.append(merged)
    return slices


def merge_expert_slices(state: dict, slices: list[dict]) -> dict:
    """`state` read from DeepSpeed's files (expert-parallel rank 0's experts) with every expert
    tensor completed by the other ranks' slices, in expert order: the full `(E, ...)`."""
    out = dict(state)
    for name, first in state.items():
        if not is_expert_name(name) or not slices:
            continue
        missing = [r + 1 for r, s in enumerate(slices) if name not in s]
        if missing:
            raise ValueError(
                f"expert tensor '{name}' is missing from the expert files of expert-parallel "
                f"ranks {missing}: the checkpoint is incomplete or of another model"
            )
        out[name] = torch.cat([first, *(s[name] for s in slices)], dim=0)
    return out
