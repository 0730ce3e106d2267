"""The model states one rank keeps, as DeepSpeed 0.19.8's optimizer wrapper keeps them.

Which wrapper a config gets (DeepSpeed's `engine.py`, `_do_optimizer_sanity_check` and the
`_configure_*_optimizer` functions, with the DeepSpeed config this trainer exports):

- fp32: the torch optimizer itself at ZeRO 0, DeepSpeedZeroOptimizer at ZeRO 1 and 2.
- bf16: at ZeRO 0 FP16_UnfusedOptimizer on the plain engine and BF16_Optimizer (bf16
  accumulation) on the pipeline engine; at ZeRO 1 BF16_Optimizer (fp32 accumulation, from the
  `data_types` the trainer exports); at ZeRO 2 DeepSpeedZeroOptimizer.
- fp16: FP16_UnfusedOptimizer at ZeRO 0, DeepSpeedZeroOptimizer at ZeRO 1 and 2.
- ZeRO 3: DeepSpeedZeroOptimizer_Stage3.

(bf16 at ZeRO 1 with an optimizer offload or other `data_types`: DeepSpeedZeroOptimizer.)

Per rank, with N the parameters of its stage, lp their bytes (2 or 4), d the ranks a group
is partitioned over (the data-parallel size; the expert-data-parallel size for an expert
group under ZeRO 1/2), a flat group padded to `P = ceil(N_g / 2d) · 2d` elements
(`nccl_start_alignment_factor` 2) and R `reduce_bucket_size`:

- torch optimizer: the parameters (4N) and the optimizer's state; gradients (4N) from the
  backward to the step.
- FP16_UnfusedOptimizer: lp parameters, fp32 masters (4N) and the state, unsharded; lp
  gradients to the step, and in our step their fp32 copies (4N).
- BF16_Optimizer: a flat bf16 copy of every group (2P), its gradient accumulator (4P, or 2P
  at ZeRO 0), fp32 masters and state partitioned (4P/d); bf16 gradients (2N) from the first
  backward to the step; the boundary all-reduce copies the accumulators (a concatenated copy
  and a bf16 copy, per 5e8-element bucket), also at one rank except at ZeRO 0.
- DeepSpeedZeroOptimizer: flat lp parameters (lpP), fp32 master partitions (4P/d, a copy
  even for fp32 models) and state; the gradient bucket `(1 + overlap_comm) · R · lp` (two at
  ZeRO 1 on the pipeline engine), a partition of reduced gradients `lp · P/d`, at ZeRO 1 the
  whole lp gradients until the boundary; in the step one group's partition flattened and in
  fp32.
- Stage3: lp partitions of every tensor (`ceil(n/d)` each, C in all), the small tensors
  (`stage3_param_persistence_threshold`) whole on every rank at d > 1, an lp gradient
  partition buffer (lp C), fp32 masters (4C, never an alias of the partition: DeepSpeed
  compares a `torch.device` with a string at `stage3.py:1163`), the state, and the reduce
  bucket (R · lp, allocated once and kept); gathered parameters of the layer running and the
  prefetched ones while it runs; with ZeRO++ hpZ (`zero_hpz_partition_size` h) a secondary
  partition of every tensor over h ranks from the forward to the step; in the step one
  sub-group flattened and in fp32.

The optimizer's state is not a table: the configured optimizer is built on `meta` tensors of
the shapes the wrapper hands it (the parameters' own, or flat partitions) and stepped once,
and its state tensors are counted. With `offload_optimizer` on the CPU, masters and state
are host memory. Each figure was checked against the bytes real CPU engines hold
(`tests/unit/planning/test_states_measured.py`).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch.utils._pytree import tree_leaves

from megatron.config.groups.optimizer import OPTIMIZER_TYPES
from megatron.planning.trace import storage_id
from megatron.training.optim.optimizers import (
    OPTIMIZERS,
    DeepSpeedCPUAdam,
    TorchAdamW,
    build_optimizer,
)

LP_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ALIGNMENT = 2  # DeepSpeed's nccl_start_alignment_factor
ALLREDUCE_BUCKET = 500_000_000  # DeepSpeed's buffered all-reduce bucket (elements)
ZERO_DEFAULTS = {
    "reduce_bucket_size": 500_000_000,
    "overlap_comm": False,
    "contiguous_gradients": True,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "sub_group_size": 1_000_000_000,
    "zero_hpz_partition_size": 1,
}
FORWARD, BACKWARD, REDUCE, STEP = "forward", "backward", "reduce", "step"
ACCUMULATED = (FORWARD, BACKWARD, REDUCE, STEP)
"""A gradient kept from the first backward to the step: also alive in the forwards of the
step's later micro-batches."""


@dataclasses.dataclass(frozen=True)
class Term:
    """Bytes one rank holds for one reason; `phases`: when a transient one is alive (none:
    persistent)."""

    name: str
    bytes: int
    phases: frozenset = frozenset()


@dataclasses.dataclass(frozen=True)
class ModelStates:
    wrapper: str
    terms: tuple[Term, ...]
    host: tuple[Term, ...] = ()
    """What an offloaded optimizer keeps in the CPU's memory."""

    @property
    def persistent(self) -> int:
        return sum(t.bytes for t in self.terms if not t.phases)

    def during(self, phase: str) -> int:
        """The transient bytes alive in `phase` (forward: of a micro-batch after the first;
        backward, reduce or step)."""
        return sum(t.bytes for t in self.terms if phase in t.phases)


def _transient(name: str, nbytes: float, *phases: str) -> Term:
    return Term(name, int(nbytes), frozenset(phases))


@dataclasses.dataclass(frozen=True)
class Group:
    """One optimizer parameter group of a rank: its tensors' sizes, the ranks it is
    partitioned over."""

    numels: tuple[int, ...]
    ranks: int
    shapes: tuple[tuple[int, ...], ...]

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def padded(self) -> int:
        multiple = ALIGNMENT * self.ranks
        return -(-self.numel // multiple) * multiple

    @property
    def partition(self) -> int:
        return self.padded // self.ranks

    @property
    def stage3_partition(self) -> int:
        return sum(-(-n // self.ranks) for n in self.numels)


def wrapper_of(ds_config: dict, dtype: str, pipeline: bool) -> str:
    """The DeepSpeed wrapper of the module docstring's table."""
    zero = ds_config.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0))
    if stage == 3:
        return "DeepSpeedZeroOptimizer_Stage3"
    if dtype == "bf16" and (stage == 1 or (stage == 0 and pipeline)):
        offload = (zero.get("offload_optimizer") or {}).get("device", "none") != "none"
        accum = (ds_config.get("data_types") or {}).get("grad_accum_dtype")
        if stage == 0 or (accum == "fp32" and not offload):
            return "BF16_Optimizer"
    if stage in (1, 2):
        return "DeepSpeedZeroOptimizer"
    return "torch optimizer" if dtype == "fp32" else "FP16_UnfusedOptimizer"


def optimizer_state_bytes(optimizer_type: str, params: dict, shapes_by_group) -> int:
    """The state the configured optimizer keeps over fp32 tensors of these shapes, counted
    after one step on `meta` (the module docstring); DeepSpeed's C++ CPU Adam steps host
    tensors only: its fp32 moments from the optimizer table (`OPTIMIZER_TYPES`)."""
    if isinstance(OPTIMIZERS[optimizer_type], DeepSpeedCPUAdam):
        numel = sum(math.prod(s) for shapes in shapes_by_group for s in shapes)
        return 4 * numel * OPTIMIZER_TYPES[optimizer_type].saved_states(params, 1)
    groups = []
    with torch.device("meta"):
        for shapes in shapes_by_group:
            tensors = [torch.nn.Parameter(torch.empty(s)) for s in shapes]
            for t in tensors:
                t.grad = torch.empty_like(t)
            groups.append({"params": tensors})
    params = dict(params or {})
    if isinstance(OPTIMIZERS[optimizer_type], TorchAdamW):
        params["fused"] = False  # the same state; the fused kernel takes no meta tensors
    optimizer = build_optimizer(groups, optimizer_type, 1e-3, 0.0, params)
    optimizer.step()
    sizes = {
        storage_id(t): t.untyped_storage().nbytes()
        for state in optimizer.state.values()
        for t in tree_leaves(state)
        if isinstance(t, torch.Tensor)
    }
    return sum(sizes.values())


def plan_groups(cfg, module: torch.nn.Module, dp: int, ep: int) -> list[Group]:
    """The optimizer groups of `module`'s parameters, with the ranks each is split over."""
    from megatron.training.optim.optimizers import optimizer_groups

    out = []
    for group in optimizer_groups(cfg, module):
        ranks = dp // ep if group.get("moe") else dp
        params = group["params"]
        out.append(
            Group(
                tuple(p.numel() for p in params),
                max(ranks, 1),
                tuple(tuple(p.shape) for p in params),
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class Rank:
    """What the wrapper formulas read about one rank and its config."""

    groups: list[Group]
    lp: int
    dp: int
    zero: dict
    pipeline: bool
    optimizer_type: str
    optimizer_params: dict
    largest_layer: int = 0
    """Parameters of the rank's largest layer (ZeRO 3 gathers a layer at a time)."""
    micro_batches: int = 1

    @property
    def n(self) -> int:
        return sum(g.numel for g in self.groups)

    @property
    def padded(self) -> int:
        return sum(g.padded for g in self.groups)

    @property
    def partitions(self) -> int:
        return sum(g.partition for g in self.groups)

    def setting(self, key: str):
        return self.zero.get(key, ZERO_DEFAULTS[key])

    def state(self, shapes_by_group) -> int:
        return optimizer_state_bytes(self.optimizer_type, self.optimizer_params, shapes_by_group)

    def flat_state(self, sizes) -> int:
        return self.state([[(n,)] for n in sizes])

    @property
    def offloaded(self) -> bool:
        return (self.zero.get("offload_optimizer") or {}).get("device", "none") != "none"


def _torch(r: Rank) -> list[Term]:
    terms = [Term("parameters (fp32)", 4 * r.n)]
    terms.append(Term("optimizer state", r.state([g.shapes for g in r.groups])))
    terms.append(_transient("gradients (fp32)", 4 * r.n, *ACCUMULATED))
    if r.dp > 1:
        terms.append(_transient("all-reduce bucket copy", 4 * min(r.n, ALLREDUCE_BUCKET), REDUCE))
    return terms


def _unfused(r: Rank) -> list[Term]:
    terms = [
        Term(f"parameters ({r.lp} bytes)", r.lp * r.n),
        Term("fp32 master weights", 4 * r.n),
        Term("optimizer state", r.state([g.shapes for g in r.groups])),
        _transient("gradients", r.lp * r.n, *ACCUMULATED),
        _transient("fp32 gradients of the step", 4 * r.n, STEP),
    ]
    if r.dp > 1:
        copy = r.lp * min(r.n, ALLREDUCE_BUCKET)
        terms.append(_transient("all-reduce bucket copy", copy, REDUCE))
    return terms


def _bf16(r: Rank, stage: int) -> list[Term]:
    accum = 4 if stage == 1 else 2
    terms = [
        Term("flat bf16 parameters", 2 * r.padded),
        Term(f"gradient accumulator ({'fp32' if accum == 4 else 'bf16'})", accum * r.padded),
        Term("fp32 master partition", 4 * r.partitions),
        Term("optimizer state", r.flat_state(g.partition for g in r.groups)),
        _transient("bf16 gradients", 2 * r.n, *ACCUMULATED),
    ]
    if stage > 0 or r.dp > 1:  # the trainer skips the reduction at ZeRO 0 on one rank
        bucket = min(r.padded, ALLREDUCE_BUCKET)
        terms.append(_transient("all-reduce copies", (accum + 2) * bucket, REDUCE))
    if accum == 2:
        terms.append(_transient("fp32 gradient partition", 4 * r.partitions, STEP))
    return terms


def _zero12(r: Rank, stage: int) -> list[Term]:
    lp, bucket = r.lp, r.setting("reduce_bucket_size")
    terms = [
        Term(f"flat parameters ({lp} bytes)", lp * r.padded),
        Term("fp32 master partition", 4 * r.partitions),
        Term("optimizer state", r.flat_state(g.partition for g in r.groups)),
    ]
    if stage == 2:  # filled as the backward reduces; a new one each micro-batch
        reduced = _transient("reduced gradient partition", lp * r.partitions, *ACCUMULATED)
        terms.append(reduced)
        if r.micro_batches > 1:  # the last micro-batch's, until the new one replaces it
            terms.append(_transient("the previous reduced partition", reduced.bytes, BACKWARD))
    else:
        terms.append(_transient("reduced gradient partition", lp * r.partitions, REDUCE, STEP))
    buckets = 2 if (stage == 1 and r.pipeline) else 1 + bool(r.setting("overlap_comm"))
    if stage == 2:
        terms.append(_transient("gradient buckets", buckets * bucket * lp, BACKWARD))
    else:
        terms.append(_transient("gradients", lp * r.n, FORWARD, BACKWARD, REDUCE))
        terms.append(_transient("gradient buckets", buckets * bucket * lp, REDUCE))
    largest = max(g.partition for g in r.groups)
    step = 4 * largest if lp == 4 else (lp + 4) * largest
    terms.append(_transient("one group flattened for the step", step, STEP))
    return terms


def _stage3(r: Rank) -> list[Term]:
    lp, bucket = r.lp, r.setting("reduce_bucket_size")
    partition = sum(g.stage3_partition for g in r.groups)
    threshold = r.setting("stage3_param_persistence_threshold")
    persistent = sum(r.dp * -(-n // r.dp) for g in r.groups for n in g.numels if n <= threshold)
    sub = r.setting("sub_group_size")
    pieces = [
        min(sub, g.stage3_partition - i)
        for g in r.groups
        for i in range(0, g.stage3_partition, sub)
    ]
    terms = [
        Term(f"parameter partitions ({lp} bytes)", lp * partition),
        Term("gradient partitions", lp * partition),
        Term("fp32 master partitions", 4 * partition),
        Term("optimizer state", r.flat_state(pieces)),
        Term("reduce bucket", bucket * lp if r.setting("contiguous_gradients") else 0),
    ]
    if r.dp > 1:
        terms.append(Term("persistent small parameters (whole)", lp * persistent))
    prefetch = r.largest_layer + r.setting("stage3_prefetch_bucket_size")
    live = min(r.setting("stage3_max_live_parameters"), prefetch, r.n)  # no more than there is
    terms.append(_transient("gathered parameters (layer + prefetch)", lp * live, BACKWARD))
    hpz = int(r.setting("zero_hpz_partition_size") or 1)
    if hpz > 1:  # ZeRO++: a secondary partition over hpz ranks, from the forward to the step
        secondary = sum(r.dp * -(-n // r.dp) // hpz for g in r.groups for n in g.numels)
        terms.append(_transient("hpZ secondary partitions", lp * secondary, FORWARD, BACKWARD))
    terms.append(_transient("a layer's gradients before reduction", lp * r.largest_layer, BACKWARD))
    step = max(pieces) * (4 if lp == 4 else lp + 4)
    terms.append(_transient("one sub-group flattened for the step", step, STEP))
    return terms


MASTER_TERMS = (
    "fp32 master weights",
    "fp32 master partition",
    "fp32 master partitions",
    "optimizer state",
)


def model_states(r: Rank, wrapper: str) -> ModelStates:
    """The terms of `wrapper` for rank `r` (module docstring); masters and state on the host
    under an optimizer offload."""
    stage = int(r.zero.get("stage", 0))
    terms = {
        "torch optimizer": lambda: _torch(r),
        "FP16_UnfusedOptimizer": lambda: _unfused(r),
        "BF16_Optimizer": lambda: _bf16(r, stage),
        "DeepSpeedZeroOptimizer": lambda: _zero12(r, stage),
        "DeepSpeedZeroOptimizer_Stage3": lambda: _stage3(r),
    }[wrapper]()
    if r.micro_batches > 1 or stage >= 2:  # a new gradient is added in, or copied out, then freed
        largest = max((n for g in r.groups for n in g.numels), default=0)
        terms.append(_transient("one tensor's new gradient", r.lp * largest, BACKWARD))
    if not r.offloaded:
        return ModelStates(wrapper, tuple(terms))
    host = tuple(t for t in terms if t.name in MASTER_TERMS)
    return ModelStates(wrapper, tuple(t for t in terms if t.name not in MASTER_TERMS), host)
