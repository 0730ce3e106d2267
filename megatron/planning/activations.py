"""Activation memory of one rank of a pipeline stage, from traced parts.

Each part of the stage is traced on `meta` at the real micro batch, sequence and per-rank
widths (`parts.py`): the embedding entries, each kind of transformer layer (class, attention
type, experts or not) and the entries after the layers with the loss. A layer kind is traced
alone and as two layers in a row: the difference is what each further layer keeps, the rest is
what the first layer of a forward builds for all of them (rotary angles, masks, biases:
`megatron/model/attention_masks.py`), counted once. The parts then become `Unit`s and one
micro-batch's forward and backward is walked over them (`walk`):

- a unit keeps `held` bytes from its forward to its backward; its forward needs `forward`
  bytes on top of what the units before it keep (its input included), its backward
  `backward` bytes on top of what the units before it keep;
- with activation checkpointing (`checkpoint_activations`, every `checkpoint_num_layers`
  layers: DeepSpeed's aligned windows of a stage's entries on the pipeline engine, runs of
  consecutive layers on the plain engine, `megatron/model/gpt.py`), a window of layers keeps
  only its input (1/tp of it under `partition_activations` at tp > 1, which DeepSpeed splits
  over the tensor-parallel ranks), runs its first forward without autograd and, in its
  backward, recomputes itself with autograd and backpropagates, holding the recomputed output
  meanwhile: its layers' units walked inside it;
- DeepSpeed's pipeline engine keeps each micro-batch's stage output until its backward (1/tp
  of it, partitioned over the tensor-parallel ranks, at tp > 1 without sequence
  parallelism), and
  its 1F1B schedule has `min(stages - stage, micro-batches)` micro-batches in flight on a
  stage (the first stage holds up to `pp`): the peak is the micro-batches in flight but one
  times what one keeps, plus one micro-batch's own peak.

A dropless MoE layer's memory depends on the routing; it is traced as routed evenly (each
expert gets its share of the tokens: token dropping at capacity factor 1).
"""

from __future__ import annotations

import dataclasses

import torch

from megatron.model.moe import MoEMLP, is_moe_layer
from megatron.model.specs import TRANSFORMER_LAYER_NAMES
from megatron.planning.parts import PartTrace, SeededTracker, trace_part
from megatron.planning.stages import Entry, PlannedModel, Stage


@dataclasses.dataclass(frozen=True)
class Unit:
    """One step of a micro-batch's walk (module docstring), bytes."""

    name: str
    held: int
    forward: int
    backward: int
    params: int = 0
    """Parameters of its entries (whose gradients its backward makes)."""


@dataclasses.dataclass(frozen=True)
class Microbatch:
    """What one micro-batch of a stage costs: `held` from the end of its forward to its
    backward, and the most it holds at once in its forward and in its backward (in the parts
    named)."""

    held: int
    forward: int
    backward: int
    forward_in: str
    backward_in: str
    points: tuple[tuple[int, int], ...] = ()
    """Each unit's backward, last unit first: the bytes held at its most, and the parameters
    whose gradients exist by then (its own and the later units')."""


def walk(units: list[Unit]) -> Microbatch:
    """Forward through `units`, then backward (module docstring)."""
    held, forward, forward_in = 0, 0, ""
    for unit in units:
        if held + unit.forward > forward:
            forward, forward_in = held + unit.forward, unit.name
        held += unit.held
    kept, backward, backward_in, done, points = held, 0, "", 0, []
    for unit in reversed(units):
        held -= unit.held
        done += unit.params
        points.append((held + unit.backward, done))
        if held + unit.backward > backward:
            backward, backward_in = held + unit.backward, unit.name
    return Microbatch(kept, forward, backward, forward_in, backward_in, tuple(points))


def plain_unit(
    name: str, trace: PartTrace, params: int, shared: int = 0, first: bool = True
) -> Unit:
    """A traced part as a unit; `shared`: bytes its trace holds for the layers after it, left
    out when it is not the `first` of them."""
    kept_input = trace.input_bytes if trace.saves_input else 0
    drop = 0 if first else shared
    return Unit(
        name,
        held=trace.saved + kept_input - drop,
        forward=trace.input_bytes + trace.forward_peak - drop,
        backward=trace.backward_peak + kept_input - drop,
        params=params,
    )


def stage_inputs(planned: PlannedModel, micro_batch: int, seq: int, stop: int) -> dict:
    """The input of every entry of the layer list up to `stop`, by index: one forward on
    `meta` without autograd from the tokens."""
    tokens = torch.zeros(micro_batch, seq, dtype=torch.long, device="meta")
    x, inputs = (tokens, torch.zeros_like(tokens)), {}
    with torch.no_grad(), SeededTracker():
        for index, fn in enumerate(planned.model.forward_funcs[:stop]):
            inputs[index] = x
            x = fn(x)
    inputs[stop] = x
    return inputs


def is_layer(entry: Entry) -> bool:
    return entry.name in TRANSFORMER_LAYER_NAMES


def layer_kind(planned: PlannedModel, entry: Entry) -> tuple:
    layer = entry.index - 2
    args = planned.args
    return entry.name, args.attention_type(layer), is_moe_layer(args, layer)


def _even_routing(module: torch.nn.Module) -> None:
    for moe in (m for m in module.modules() if isinstance(m, MoEMLP)):
        if not moe.dropping:
            moe.dropping, moe.capacity_factors = True, (1.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """`interval` transformer layers per checkpointed window (0: off); `partition`: inputs
    split over the tensor-parallel ranks; `aligned`: DeepSpeed's pipeline windows."""

    interval: int = 0
    partition: bool = False
    aligned: bool = True


def windows(entries: list[Entry], ckpt: Checkpointing) -> list[tuple[list[Entry], bool]]:
    """The stage's entries in the runs its forward takes, each with whether it is
    checkpointed (`megatron/model/gpt.py`; DeepSpeed's `PipelineModule.forward`)."""
    if not ckpt.interval:
        return [([e], False) for e in entries]
    if ckpt.aligned:
        runs = [entries[i : i + ckpt.interval] for i in range(0, len(entries), ckpt.interval)]
        return [(run, all(is_layer(e) for e in run)) for run in runs]
    out, i = [], 0
    while i < len(entries):
        j = i
        while j < len(entries) and j - i < ckpt.interval and is_layer(entries[j]):
            j += 1
        out.append((entries[i:j], True) if j > i else ([entries[i]], False))
        i = max(j, i + 1)
    return out


@dataclasses.dataclass(frozen=True)
class StageActivations:
    """A stage's activation bytes on one rank (module docstring)."""

    microbatch: Microbatch
    in_flight: int
    units: list[Unit]
    traffic: dict[str, int]
    """Bytes each tensor-parallel collective is handed per micro-batch, forward and
    backward (a checkpointed window's recomputation included)."""

    @property
    def others(self) -> int:
        """What the other micro-batches in flight hold meanwhile."""
        return (self.in_flight - 1) * self.microbatch.held

    @property
    def forward(self) -> int:
        return self.others + self.microbatch.forward

    @property
    def backward(self) -> int:
        return self.others + self.microbatch.backward

    @property
    def peak(self) -> int:
        return max(self.forward, self.backward)

    @property
    def backward_points(self) -> list[tuple[int, int]]:
        """`Microbatch.points`, with what the other micro-batches in flight hold."""
        return [(self.others + held, done) for held, done in self.microbatch.points]


class StageTracer:
    """Traces the parts of a planned model's stages at one micro batch (module docstring)."""

    def __init__(self, planned: PlannedModel, micro_batch: int, seq: int, device: str = "cuda"):
        self.planned, self.micro_batch, self.seq = planned, micro_batch, seq
        self.device = device
        self.groups = [g for g in (planned.tp_group, planned.ep_group) if g is not None]
        _even_routing(planned.model)
        self.inputs = stage_inputs(planned, micro_batch, seq, len(planned.model.forward_funcs))
        self._kinds: dict[tuple, tuple[PartTrace, int]] = {}
        self.shared = None

    def _trace(self, fn, inputs, parameters) -> PartTrace:
        return trace_part(fn, inputs, parameters, device=self.device, groups=self.groups)

    def layer(self, entry: Entry) -> tuple[PartTrace, int]:
        """One layer of `entry`'s kind traced, and the bytes it holds for later layers."""
        kind = layer_kind(self.planned, entry)
        if kind not in self._kinds:
            layer, x = entry.module, self.inputs[entry.index]
            one = self._trace(layer, x, layer.parameters())
            two = self._trace(lambda t: layer(layer(t)), x, layer.parameters())
            # two in a row keep twice a layer's own, the second layer's input (the first's
            # output) and once what the first builds for both: the rest of one's is shared
            own = two.saved - one.saved - (one.input_bytes if one.saves_input else 0)
            self._kinds[kind] = (one, max(0, one.saved - own))
        return self._kinds[kind]

    def rest(self, entries: list[Entry], last: bool) -> PartTrace:
        """Consecutive entries other than layers, ending in the loss on the last stage."""
        fns = [e.fn for e in entries]
        b, s = self.micro_batch, self.seq
        labels = (
            torch.zeros(b, s, dtype=torch.long, device="meta"),
            torch.ones(b, s, device="meta"),
        )

        def run(x):
            for fn in fns:
                x = fn(x)
            return self.planned.model.loss_fn(x, labels) if last else x

        params = [p for e in entries if e.module is not None for p in e.module.parameters()]
        return self._trace(run, self.inputs[entries[0].index], params)


def _add(total: dict, more: dict, times: int = 1) -> None:
    for key, n in more.items():
        total[key] = total.get(key, 0) + times * n


PART_NAMES = {
    "EmbeddingPipe": "embedding",
    "before_transformer_layers": "",
    "after_transformer_layers": "",
    "FinalNormPipe": "final norm",
    "OutputHeadPipe": "head",
    "WordEmbeddingPipe": "head (tied)",
    "ValueHeadPipe": "value head",
}
"""How the report names the entries of the layer list around the layers (the two layout
functions are no part of their own)."""


def _params(entry: Entry) -> int:
    if entry.module is None:
        return 0
    return sum(p.numel() for p in entry.module.parameters() if p.requires_grad)


class _UnitBuilder:
    """The units of one stage, in forward order, and their traffic."""

    def __init__(self, tracer: StageTracer, stage: Stage, ckpt: Checkpointing, tp: int):
        self.tracer, self.stage, self.ckpt, self.tp = tracer, stage, ckpt, tp
        self.units: list[Unit] = []
        self.traffic: dict[str, int] = {}
        self.first_layer = True
        self.rest: list[Entry] = []

    def layer_unit(self, entry: Entry, first: bool) -> tuple[Unit, PartTrace]:
        trace, shared = self.tracer.layer(entry)
        unit = plain_unit(f"layer {entry.index - 2}", trace, _params(entry), shared, first)
        return unit, trace

    def flush(self, last: bool = False) -> None:
        if self.rest:
            trace = self.tracer.rest(self.rest, last)
            names = [PART_NAMES.get(e.name, e.name) for e in self.rest] + (["loss"] if last else [])
            names = " + ".join(n for n in names if n)
            params = sum(_params(e) for e in self.rest)
            self.units.append(plain_unit(names, trace, params))
            _add(self.traffic, trace.traffic)
            self.rest = []

    def add(self, run: list[Entry], checkpointed: bool) -> None:
        if checkpointed:
            return self.window(run)
        for entry in run:
            if not is_layer(entry):
                self.rest.append(entry)
                continue
            self.flush()
            unit, trace = self.layer_unit(entry, self.first_layer)
            self.first_layer = False
            self.units.append(unit)
            _add(self.traffic, trace.traffic)

    def window(self, run: list[Entry]) -> None:
        """A checkpointed window: its input kept, recomputed in the backward."""
        self.flush()
        inner = []
        for i, entry in enumerate(run):
            unit, trace = self.layer_unit(entry, i == 0)  # the recompute builds its own
            inner.append(unit)
            _add(self.traffic, trace.traffic)
            _add(self.traffic, trace.forward_traffic)
        first_trace, _ = self.tracer.layer(run[0])
        full = first_trace.input_bytes
        kept = -(-full // self.tp) if self.ckpt.partition and self.tp > 1 else full
        nograd = max(self.tracer.layer(e)[0].nograd_peak for e in run)
        # DeepSpeed's backward holds the recomputed output while it backpropagates through it
        output = first_trace.output_bytes
        inside = walk(inner)
        recompute = max(inside.forward, inside.backward) + output + (kept if kept != full else 0)
        name = f"layers {run[0].index - 2}-{run[-1].index - 2} (checkpointed)"
        params = sum(u.params for u in inner)
        self.units.append(Unit(name, kept, full + nograd, recompute, params))


def kept_buffers(tracer: StageTracer, stage: Stage, stages: int, tp_split: int) -> dict:
    """The bytes kept between steps outside the model states: what the layers of the last
    forward built for all of them (rotary angles, masks), cached; and on the pipeline
    engine, on a stage with a stage before it, the receive buffer, the last micro-batch's
    copy of it and that copy's gradient, on one with a stage after it, the buffer that
    receives its output's gradient (1/tp of each with `pipe_partitioned`: `tp_split`; `stages`
    1 for the plain engine)."""

    def size(index: int) -> int:
        hidden = tracer.inputs[index][0]
        return -(-hidden.numel() * hidden.element_size() // tp_split)

    out = {}
    layers = [e for e in stage.entries if is_layer(e)]
    if layers:  # the attention layers' cache keeps the last forward's (`attention_masks.py`)
        out["position tensors of the last forward"] = tracer.layer(layers[0])[1]
    if stage.index > 0:
        out["received activations, a copy and its gradient"] = 3 * size(stage.entries[0].index)
    if stage.index < stages - 1:
        out["received output gradient"] = size(stage.entries[-1].index + 1)
    return out


def stage_activations(
    tracer: StageTracer,
    stage: Stage,
    ckpt: Checkpointing,
    *,
    tp: int,
    pipeline: bool,
    stages: int,
    micro_batches: int,
    partitioned_output: bool = False,
) -> StageActivations:
    """The activation bytes of `stage` on one rank (module docstring); `partitioned_output`:
    DeepSpeed splits the stage's output over the tensor-parallel ranks (its `pipeline`
    section's `pipe_partitioned`, on by default at tp > 1)."""
    build = _UnitBuilder(tracer, stage, ckpt, tp)
    for run, checkpointed in windows(stage.entries, ckpt):
        build.add(run, checkpointed)
    build.flush(last=stage.last)
    units = build.units
    if pipeline and not stage.last:  # the engine keeps the stage output until the backward
        out = tracer.inputs[stage.entries[-1].index + 1][0]
        nbytes = out.numel() * out.element_size()
        if partitioned_output:  # DeepSpeed keeps this rank's 1/tp of it (`pipe_partitioned`)
            nbytes = -(-nbytes // tp)
        units = [*units, Unit("stage output (pipeline buffer)", nbytes, nbytes, 0)]
    in_flight = min(stages - stage.index, micro_batches) if pipeline and stages > 1 else 1
    return StageActivations(walk(units), in_flight, units, build.traffic)
