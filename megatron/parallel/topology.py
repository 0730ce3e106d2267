"""The parallel topology: data x pipeline x tensor = world size, and its process groups.

One `ParallelTopology` is built per process at start-up and passed explicitly to whatever needs
a group (no process-group globals). Rank placement is DeepSpeed's
`PipeModelDataParallelTopology(num_pp, num_mp, num_dp)`, axes `(pipe, data, model)` in
row-major order, so tensor-parallel ranks are adjacent (one node's fast links), then data
parallel, then pipeline stages. Pass `topology.ds_topology` to DeepSpeed's `PipelineModule`
(its engine then builds the same groups); pass the topology itself as `mpu` to
`deepspeed.initialize` for the non-pipeline engine (see `mpu.py`).

Example, world 8 with tp=2, pp=2 (so dp=2): rank = pp_rank*4 + dp_rank*2 + tp_rank, i.e.
tensor groups [0,1] [2,3] [4,5] [6,7], data groups [0,2] [1,3] [4,6] [5,7], pipelines [0,4]
[1,5] [2,6] [3,7].

Expert parallelism (`ep_size`, mixture of experts) carves groups of `ep_size` consecutive
members out of each data-parallel group: with dp 4 = ranks [0,1,2,3] and ep 2, the expert-
parallel groups are [0,1] [2,3] (the experts of a MoE layer are split over them) and the
expert-data-parallel groups [0,2] [1,3] (ranks holding the same experts, over which expert
gradients are reduced).
"""

from __future__ import annotations

import numbers

import torch.distributed as dist
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

from megatron.parallel.mpu import DeepSpeedMpuMixin

# Every rank creates every group in this order (group creation is collective).
_GROUP_AXES = ("data", "pipe", "model", "replica", "expert", "expert_data")


def _dist_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def _check_int(key: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _resolve_world_size(world_size) -> int:
    if world_size is None:
        return dist.get_world_size() if _dist_ready() else 1
    world_size = _check_int("world size", world_size, 1)
    if _dist_ready() and world_size != dist.get_world_size():
        raise ValueError(
            f"ParallelTopology: world_size={world_size} but torch.distributed runs "
            f"{dist.get_world_size()} processes; leave world_size unset to use it"
        )
    return world_size


def _resolve_rank(rank, world_size: int) -> int:
    if rank is None:
        return dist.get_rank() if _dist_ready() else 0
    rank = _check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"ParallelTopology: rank {rank} is outside [0, {world_size})")
    if _dist_ready() and rank != dist.get_rank():
        raise ValueError(
            f"ParallelTopology: rank {rank} given, but this process is rank {dist.get_rank()}"
        )
    return rank


class ParallelTopology(DeepSpeedMpuMixin):
    """Sizes, this rank's coordinates and the process groups of a dp x pp x tp layout.

    Args:
        tp_size: tensor-parallel size (config key `model_parallel_size`).
        pp_size: pipeline stages (config key `pipe_parallel_size`); 0 means "no pipeline
            engine" and, like 1, gives one stage.
        world_size: defaults to `torch.distributed`'s world size when it is initialised (and
            must then equal it), else 1. Given without `torch.distributed`, it lets a launcher
            or config check validate a layout without processes; no groups exist then.
        rank: this process's global rank; defaults like `world_size` (0 without dist).
        ep_size: expert-parallel size (config key `moe_expert_parallel_size`); divides dp.

    Attributes: `world_size, tp_size, pp_size, dp_size, rank, tp_rank, pp_rank, dp_rank`;
    `tp_ranks, pp_ranks, dp_ranks` (global ranks of this rank's groups, in group order);
    `ep_size, ep_rank, ep_ranks, edp_ranks` (mixture of experts, see the module docstring);
    `tp_group, pp_group, dp_group, ep_group, edp_group` (None when that size is 1 or dist is
    not initialised: the layers read `tp_group=None` as "no tensor parallelism");
    `ds_topology`.
    """

    def __init__(
        self, tp_size: int = 1, pp_size: int = 1, world_size=None, *, rank=None, ep_size: int = 1
    ):
        self.tp_size = _check_int("model_parallel_size", tp_size, 1)
        self.pp_size = _check_int("pipe_parallel_size", pp_size, 0) or 1
        self.world_size = _resolve_world_size(world_size)
        model_size = self.tp_size * self.pp_size
        if self.world_size % model_size != 0:
            valid = [d for d in range(1, self.world_size + 1) if self.world_size % d == 0]
            hint = "" if _dist_ready() or world_size is not None else " (the default without dist)"
            raise ValueError(
                f"world size {self.world_size}{hint} = data x pipeline x tensor parallel, but "
                f"pipe_parallel_size ({self.pp_size}) x model_parallel_size ({self.tp_size}) "
                f"= {model_size} does not divide it; pick sizes whose product is one of {valid}"
            )
        self.dp_size = self.world_size // model_size
        self.rank = _resolve_rank(rank, self.world_size)

        self.ds_topology = PipeModelDataParallelTopology(
            num_pp=self.pp_size, num_mp=self.tp_size, num_dp=self.dp_size
        )
        coord = self.ds_topology.get_coord(self.rank)
        self.pp_rank, self.dp_rank, self.tp_rank = coord.pipe, coord.data, coord.model
        self.tp_ranks = self._members("model")
        self.pp_ranks = self._members("pipe")
        self.dp_ranks = self._members("data")
        self.ep_size = _check_int("moe_expert_parallel_size", ep_size, 1)
        if self.dp_size % self.ep_size:
            raise ValueError(
                f"moe_expert_parallel_size {self.ep_size} must divide the data-parallel size "
                f"{self.dp_size}: expert-parallel groups are carved from data-parallel ranks"
            )
        self.ep_rank = self.dp_rank % self.ep_size
        self.ep_ranks = self._members("expert")
        self.edp_ranks = self._members("expert_data")
        self._groups = self._create_groups() if _dist_ready() else {}

    @classmethod
    def from_config(cls, cfg) -> ParallelTopology:
        """Build from `cfg.parallel.model_parallel_size` / `pipe_parallel_size`.

        The world size comes from `torch.distributed` when it is initialised, else from
        `cfg.parallel.world_size` when the config has derived it, else 1.
        """
        par = cfg.parallel
        world_size = None if _dist_ready() else getattr(par, "world_size", None)
        moe = getattr(cfg, "moe", None)
        return cls(
            tp_size=par.model_parallel_size,
            pp_size=par.pipe_parallel_size,
            world_size=world_size,
            ep_size=getattr(moe, "moe_expert_parallel_size", 1),
        )

    def _comm_lists(self, axis: str) -> list[list[int]]:
        if axis == "replica":  # pipe x model ranks of one data-parallel index
            return [sorted(self.ds_topology.filter_match(data=d)) for d in range(self.dp_size)]
        if axis in ("expert", "expert_data"):
            return self._expert_lists(axis == "expert")
        return self.ds_topology.get_axis_comm_lists(axis)

    def _expert_lists(self, expert: bool) -> list[list[int]]:
        """Expert-parallel groups (consecutive runs of `ep_size` in each data-parallel group)
        or expert-data-parallel groups (every `ep_size`-th member of one)."""
        ep, lists = self.ep_size, []
        for dp_ranks in self.ds_topology.get_axis_comm_lists("data"):
            if expert:
                lists += [dp_ranks[i : i + ep] for i in range(0, len(dp_ranks), ep)]
            else:
                lists += [dp_ranks[i::ep] for i in range(ep)]
        return lists

    def _members(self, axis: str) -> list[int]:
        return next(ranks for ranks in self._comm_lists(axis) if self.rank in ranks)

    def _create_groups(self) -> dict:
        # Collective: all ranks walk the same axes and lists in the same order. Groups of one
        # are created too, because the `mpu` methods must always return a real group.
        groups = {}
        for axis in _GROUP_AXES:
            groups[axis], _ = dist.new_subgroups_by_enumeration(self._comm_lists(axis))
        return groups

    def _group(self, axis: str):
        if axis not in self._groups:
            raise RuntimeError(
                "ParallelTopology has no process groups: it was built before "
                "torch.distributed was initialised; initialise it first (deepspeed."
                "init_distributed) and build the topology on every rank"
            )
        return self._groups[axis]

    def _group_if_parallel(self, axis: str, size: int):
        return self._groups.get(axis) if size > 1 else None

    @property
    def tp_group(self):
        """The tensor-parallel group, or None without tensor parallelism."""
        return self._group_if_parallel("model", self.tp_size)

    @property
    def pp_group(self):
        """The group of this pipeline's stages, or None with one stage."""
        return self._group_if_parallel("pipe", self.pp_size)

    @property
    def dp_group(self):
        """The data-parallel group (same shard, different data), or None when dp is 1."""
        return self._group_if_parallel("data", self.dp_size)

    @property
    def ep_group(self):
        """The expert-parallel group (ranks sharing out the experts), or None when ep is 1."""
        return self._group_if_parallel("expert", self.ep_size)

    @property
    def edp_group(self):
        """The expert-data-parallel group (ranks holding the same experts), or None when it
        has one rank."""
        return self._group_if_parallel("expert_data", self.dp_size // self.ep_size)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def __repr__(self) -> str:
        return (
            f"ParallelTopology(world={self.world_size} = dp {self.dp_size} x pp {self.pp_size} "
            f"x tp {self.tp_size}; rank {self.rank} -> dp {self.dp_rank}, pp {self.pp_rank}, "
            f"tp {self.tp_rank})"
        )
