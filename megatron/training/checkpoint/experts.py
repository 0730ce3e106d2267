"""Saving and restoring the experts that DeepSpeed's own files do not hold (expert parallelism).

Without ZeRO, DeepSpeed writes the module and optimizer states of each tensor-parallel rank
(and pipeline stage) from data-parallel rank 0 only, and every rank loads that file back.
With `moe_expert_parallel_size` ep > 1, data-parallel rank 0 holds the experts of
expert-parallel rank 0 only (`first = 0 .. E/ep - 1` of each MoE layer). The other slices are
written here, once each: the rank with tensor-parallel rank 0 and data-parallel rank `r`
(`0 < r < ep`, i.e. expert-parallel rank r of the first expert-data-parallel replica) of each
pipeline stage writes `expert_states_pp{P}_ep{r}.pt` beside DeepSpeed's files:

    {"ep_size": ep, "params": {name: tensor}, "optimizer": {name: {state key: tensor}}}

keyed by the engine module's parameter names (experts are whole on each tensor-parallel
rank, so one file serves them all). Every rank of expert-parallel rank r > 0 restores its
slice from that file after DeepSpeed's load (which gave it rank 0's experts), so each expert
is saved once and a resume at the same layout is exact.

Under ZeRO-1/2 (`moe_grads.py::expert_param_groups`) the experts' fp32 weights and optimizer
state are partitions of DeepSpeed's MoE parameter groups, which every rank writes to its own
`zero_pp_rank_*` file and reads back at the same layout; the files here then carry the expert
weights only (the base optimizer's state is keyed by those partitions, not by parameters).

The file names and the refusal of another expert-parallel size are
`megatron/checkpoint/experts.py`'s.
"""

from __future__ import annotations

from pathlib import Path

import torch

from megatron.checkpoint.experts import check_expert_layout, expert_file
from megatron.checkpoint.safe_load import load_file


class ExpertCheckpoint:
    """Saves and restores this rank's expert slice (module docstring)."""

    def __init__(self, module: torch.nn.Module, optimizer, topology):
        self.optimizer, self.topology = optimizer, topology
        self.params = {
            name: p for name, p in module.named_parameters() if getattr(p, "expert_parallel", False)
        }

    def check(self, folder: Path) -> None:
        """Before any load: refuse a checkpoint of another expert-parallel size."""
        if self.params:
            check_expert_layout(folder, self.topology.ep_size)

    @property
    def active(self) -> bool:
        return bool(self.params) and self.topology.ep_size > 1

    def _file(self, folder: Path) -> Path:
        return expert_file(folder, self.topology.pp_rank, self.topology.ep_rank)

    def save(self, folder: Path, with_optimizer: bool) -> None:
        topo = self.topology
        if not self.active or topo.tp_rank != 0 or not 0 < topo.dp_rank < topo.ep_size:
            return
        state = getattr(self.optimizer, "state", {})
        optim = {
            name: {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in state[p].items()}
            for name, p in self.params.items()
            if with_optimizer and p in state
        }
        params = {name: p.detach().clone() for name, p in self.params.items()}
        torch.save(
            {"ep_size": topo.ep_size, "params": params, "optimizer": optim}, self._file(folder)
        )

    def load(self, folder: Path, with_optimizer: bool) -> None:
        """After DeepSpeed's load: this rank's experts (and their optimizer state)."""
        if not self.active or self.topology.ep_rank == 0:
            return
        path = self._file(folder)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: {folder} holds no experts of expert-parallel rank "
                f"{self.topology.ep_rank} (an incomplete checkpoint, or another layout)"
            )
        saved = load_file(path)
        missing = set(self.params) - set(saved["params"])
        if missing:
            raise ValueError(f"{path} has no tensors for {sorted(missing)}: another model")
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(saved["params"][name])
        if with_optimizer:
            for name, values in saved["optimizer"].items():
                self.optimizer.state[self.params[name]] = dict(values)
