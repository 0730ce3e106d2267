"""The plan of a resolved config: per pipeline stage, what its heaviest rank holds, against the
GPU; and the step-time estimate.

`plan_run(cfg)` builds the model on `meta` at one rank's shapes (`stages.py`), traces its
activations (`activations.py`), accounts the model states of the config's DeepSpeed wrapper
(`states.py`) and estimates the step (`steptime.py`). A stage's ranks differ only in their
data-parallel index, and the first data-parallel rank's ZeRO partitions are the largest (the
padding sits in the last one's), so the figures are that rank's.

A stage's allocated peak is its persistent states plus the largest of: the activations' peak
with the states alive during the backward (gradients, buckets), the gradient reduction's
buffers, the optimizer step's. On a GPU two allowances follow, named as assumptions: the CUDA
context with NCCL's buffers, outside the allocator (`CUDA_CONTEXT_GIB`), and the caching
allocator's fragmentation (`FRAGMENTATION` of the allocated peak). The allocated peak is what
`torch.cuda.max_memory_allocated` reports; the total is what must fit.
"""

from __future__ import annotations

import dataclasses

import torch

from megatron.config import deepspeed_config
from megatron.model.args import ModelArgs
from megatron.planning.activations import (
    Checkpointing,
    StageActivations,
    StageTracer,
    kept_buffers,
    stage_activations,
)
from megatron.planning.machine import Machine, machine_of
from megatron.planning.stages import Stage, plan_stages
from megatron.planning.states import (
    BACKWARD,
    FORWARD,
    LP_BYTES,
    REDUCE,
    STEP,
    ModelStates,
    Rank,
    model_states,
    plan_groups,
    wrapper_of,
)
from megatron.planning.steptime import StepTime, communication, estimate, step_flops

CUDA_CONTEXT_GIB = 1.0
"""The CUDA context and NCCL's communication buffers: outside PyTorch's allocator (assumed)."""
FRAGMENTATION = 0.10
"""The caching allocator's reserved-but-unused share of the allocated peak (assumed)."""
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GIB = 2**30


@dataclasses.dataclass(frozen=True)
class StagePlan:
    index: int
    layers: tuple[int, int] | None
    """The first and last transformer layer of the stage (None: it holds none)."""
    parameters: int
    states: ModelStates
    reference: int
    """A frozen reference model's weights (DPO, KTO)."""
    activations: StageActivations
    micro_batches: int
    buffers: dict[str, int]
    """What else is kept between steps (`activations.kept_buffers`)."""
    allowances: dict[str, int]

    @property
    def phases(self) -> dict[str, int]:
        """The transient bytes of each phase of a step, on top of the persistent ones (a
        forward meets the gradients of the micro-batches before it)."""
        s, acts = self.states, self.activations
        return {
            "forward": acts.forward + (s.during(FORWARD) if self.micro_batches > 1 else 0),
            "backward": self.backward,
            "grad reduce": s.during(REDUCE),
            "optim step": s.during(STEP),
        }

    @property
    def backward(self) -> int:
        """The backward's most: activations, the gradients made by then (all of them when
        earlier micro-batches made them) and the backward's buffers."""
        s = self.states
        grads, buffers = s.during(FORWARD), s.during(BACKWARD) - s.during(FORWARD)
        total = max(self.parameters, 1)
        return buffers + max(
            (held + (grads if self.micro_batches > 1 else grads * done // total)
             for held, done in self.activations.backward_points),
            default=0,
        )  # fmt: skip

    @property
    def persistent(self) -> int:
        return self.states.persistent + self.reference + sum(self.buffers.values())

    @property
    def peak_phase(self) -> str:
        phases = self.phases
        return max(phases, key=phases.get)

    @property
    def allocated(self) -> int:
        return self.persistent + max(self.phases.values())

    @property
    def total(self) -> int:
        return self.allocated + sum(self.allowances.values())


@dataclasses.dataclass(frozen=True)
class Layout:
    """The sizes a plan is made for."""

    world: int
    dp: int
    tp: int
    pp: int
    ep: int
    micro_batch: int
    """Sequences per micro-batch through the model (a pairwise objective's two sides)."""
    micro_batches: int
    seq: int
    dtype: str
    zero_stage: int
    pipeline: bool

    @classmethod
    def from_config(cls, cfg, pairwise: bool = False) -> Layout:
        par, t = cfg.parallel, cfg.training
        pp = par.pipe_parallel_size
        return cls(
            world=par.world_size or 1,
            dp=par.data_parallel_size or 1,
            tp=par.model_parallel_size,
            pp=max(pp, 1),
            ep=cfg.moe.moe_expert_parallel_size,
            micro_batch=t.train_micro_batch_size_per_gpu * (2 if pairwise else 1),
            micro_batches=t.gradient_accumulation_steps,
            seq=cfg.model.seq_length,
            dtype=cfg.precision.dtype,
            zero_stage=par.zero_stage,
            pipeline=pp >= 1,
        )


def _layers(stage: Stage) -> tuple[int, int] | None:
    from megatron.planning.activations import is_layer

    layers = [e.index - 2 for e in stage.entries if is_layer(e)]
    return (layers[0], layers[-1]) if layers else None


def _holder(stage: Stage) -> torch.nn.Module:
    """The stage's modules in one container (the optimizer's groups read names)."""
    holder = torch.nn.ModuleList()
    seen = set()
    for entry in stage.entries:
        if entry.module is not None and id(entry.module) not in seen:
            seen.add(id(entry.module))
            holder.append(entry.module)
    return holder


def stage_states(cfg, stage: Stage, layout: Layout, ds: dict) -> ModelStates:
    """The model states of one rank of `stage` (`states.py`)."""
    o = cfg.optimizer
    largest = max((sum(p.numel() for p in e.module.parameters()) for e in stage.entries
                   if e.module is not None), default=0)  # fmt: skip
    rank = Rank(
        groups=plan_groups(cfg, _holder(stage), layout.dp, layout.ep),
        lp=LP_BYTES[layout.dtype],
        dp=layout.dp,
        zero=ds.get("zero_optimization") or {},
        pipeline=layout.pipeline,
        optimizer_type=o.optimizer_type,
        optimizer_params=o.optimizer_params or {},
        largest_layer=largest,
        micro_batches=layout.micro_batches,
    )
    return model_states(rank, wrapper_of(ds, layout.dtype, layout.pipeline))


@dataclasses.dataclass(frozen=True)
class RunPlan:
    layout: Layout
    machine: Machine
    stages: list[StagePlan]
    wrapper: str
    step: StepTime | None
    """None without a known peak (a CPU, an unknown GPU)."""
    assumptions: list[str]

    @property
    def heaviest(self) -> StagePlan:
        return max(self.stages, key=lambda s: s.total)

    @property
    def fits(self) -> bool | None:
        """Whether every rank's total fits its memory (None: the memory is unknown)."""
        if self.machine.memory is None:
            return None
        return self.heaviest.total <= self.machine.memory


def assumptions_of(cfg, device: str, objective) -> list[str]:
    notes = []
    if device == "cuda":
        notes.append(
            f"CUDA context and NCCL buffers {CUDA_CONTEXT_GIB:g} GiB and allocator "
            f"fragmentation {FRAGMENTATION:.0%} of the allocated peak (allowances)"
        )
        notes.append(
            "attention and dropout traced as CUDA runs them (flash or memory-efficient "
            "kernel, bool dropout masks); other kernels as their PyTorch reference"
        )
    if cfg.moe.moe_num_experts > 1 and not cfg.moe.moe_token_dropping:
        notes.append("dropless MoE layers traced with tokens routed evenly over the experts")
    if not objective.language_model:
        notes.append(
            f"train_impl {cfg.post_training.train_impl}: its loss traced as the language "
            "model's over the same logits"
        )
    if cfg.training.torch_compile:
        notes.append("torch_compile: activations traced eagerly (compiled layers keep less)")
    return notes


def _step(cfg, objective, layout: Layout, machine: Machine, stages, tracer) -> StepTime | None:
    """The step-time estimate (`steptime.py`), from the heaviest stage's traffic."""
    if machine.peak_tflops is None:
        return None
    busiest = max(stages, key=lambda s: sum(s.activations.traffic.values()))
    first_out = tracer.inputs[tracer.planned.stages[0].entries[-1].index + 1][0]
    comm = communication(
        tp=layout.tp, dp=layout.dp, pp=layout.pp, ep=layout.ep,
        micro_batches=layout.micro_batches, traffic=busiest.activations.traffic,
        boundary_bytes=first_out.numel() * first_out.element_size(),
        dp_bytes=max(s.parameters for s in stages) * LP_BYTES[layout.dtype],
        wrapper=stages[0].states.wrapper, links=machine.links,
    )  # fmt: skip
    flops, tokens = step_flops(cfg, objective)
    return estimate(flops=flops, tokens=tokens, world=layout.world,
                    peak_tflops=machine.peak_tflops, mfu=cfg.planning.plan_mfu, pp=layout.pp,
                    micro_batches=layout.micro_batches, comm=comm)  # fmt: skip


def _stage_plan(cfg, stage, tracer, layout, ds, ckpt, objective, partitioned) -> StagePlan:
    acts = stage_activations(tracer, stage, ckpt, tp=layout.tp, pipeline=layout.pipeline,
                             stages=layout.pp, micro_batches=layout.micro_batches,
                             partitioned_output=partitioned)  # fmt: skip
    states = stage_states(cfg, stage, layout, ds)
    lp = LP_BYTES[layout.dtype]
    reference = stage.parameter_count * lp if objective.needs_reference else 0
    split = layout.tp if partitioned else 1
    buffers = kept_buffers(tracer, stage, layout.pp if layout.pipeline else 1, split)
    return StagePlan(stage.index, _layers(stage), stage.parameter_count, states, reference,
                     acts, layout.micro_batches, buffers, {})  # fmt: skip


def with_allowances(plan: StagePlan) -> StagePlan:
    """A GPU's allowances (module docstring) added to a stage's plan."""
    allowances = {
        "CUDA context and NCCL buffers": int(CUDA_CONTEXT_GIB * GIB),
        "allocator fragmentation": int(FRAGMENTATION * plan.allocated),
    }
    return dataclasses.replace(plan, allowances=allowances)


def plan_run(cfg, machine: Machine | None = None) -> RunPlan:
    """The plan of `cfg` (module docstring) on `machine` (default: `machine_of(cfg)`)."""
    from megatron.training.objectives import build_objective

    machine = machine or machine_of(cfg)
    objective = build_objective(cfg)
    layout = Layout.from_config(cfg, objective.pairwise)
    args = ModelArgs.from_config(cfg)
    planned = plan_stages(args, layout.pp if layout.pipeline else 0, layout.tp, layout.ep,
                          TORCH_DTYPES[layout.dtype])  # fmt: skip
    ds = deepspeed_config(cfg)
    interval = args.checkpoint_num_layers if args.checkpoint_activations else 0
    ckpt = Checkpointing(interval, args.partition_activations, aligned=layout.pipeline)
    tracer = StageTracer(planned, layout.micro_batch, layout.seq, machine.device)
    pipe_section = {"pipe_partitioned": True, **(ds.get("pipeline") or {})}
    partitioned = layout.tp > 1 and bool(pipe_section["pipe_partitioned"])
    stages = [
        _stage_plan(cfg, stage, tracer, layout, ds, ckpt, objective, partitioned)
        for stage in planned.stages
    ]
    if machine.device == "cuda":
        stages = [with_allowances(s) for s in stages]
    step = _step(cfg, objective, layout, machine, stages, tracer)
    notes = assumptions_of(cfg, machine.device, objective)
    return RunPlan(layout, machine, stages, stages[0].states.wrapper, step, notes)
