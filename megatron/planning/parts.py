"""Trace one part of a stage (an entry of the layer list, or a run of them) on `meta`.

`trace_part(fn, inputs, parameters, device=...)` runs `fn(inputs)` forward and backward on the
`meta` device standing for `device` (`cuda` or `cpu`: under its routes, `routes.py`) and
counts, with `trace.py`'s counters, what one
micro-batch of it holds (`PartTrace`, bytes):

- `saved`: the storages its forward makes and autograd keeps for its backward; `saves_input`
  says whether its input is kept too (that storage belongs to the part before);
- `forward_peak`: the most bytes its forward holds at once, its output included;
- `backward_peak`: the most its backward holds at once: what is still saved, the gradient
  arriving for its output and the one it hands back for its input, and its temporaries (not
  the parameters' gradients: model states count those; not its output, which nothing holds
  in a backward once the part after it is done);
- `nograd_peak`: the most its forward holds without autograd (the first pass of a layer whose
  activations are checkpointed);
- `traffic`: the bytes each kind of tensor-parallel collective was handed, forward and
  backward (the planned groups' counts); `forward_traffic`: the forward's alone (what a
  checkpointed layer's recomputation hands them again).

A part's input is made before the counting starts, so no figure includes it. The cross
entropy picks its chunk size and kernels by device type (`megatron/parallel/cross_entropy.py`):
while tracing, `meta` takes the entries of the device it stands for.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses

import torch
from torch.utils._pytree import tree_leaves

from megatron.model.attention_masks import clear_masks
from megatron.parallel import MODEL_PARALLEL_RNG, cross_entropy, get_rng_tracker
from megatron.planning.routes import DeviceRoutes
from megatron.planning.trace import LiveBytes, SavedBytes, storage_id


@dataclasses.dataclass(frozen=True)
class PartTrace:
    saved: int
    saves_input: bool
    input_bytes: int
    output_bytes: int
    forward_peak: int
    backward_peak: int
    nograd_peak: int
    traffic: dict[str, int]
    forward_traffic: dict[str, int]


def _floats(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _nbytes(tensors) -> int:
    return sum({storage_id(t): t.untyped_storage().nbytes() for t in tensors}.values())


def grad_inputs(inputs, grad: bool):
    """`inputs` detached, their floating tensors asking for gradients when `grad`."""

    def prepare(t):
        if not isinstance(t, torch.Tensor):
            return t
        t = t.detach()
        return t.requires_grad_() if grad and t.is_floating_point() else t

    if isinstance(inputs, tuple):
        return tuple(prepare(t) for t in inputs)
    return prepare(inputs)


class SeededTracker:
    """The tensor-parallel RNG state exists while tracing (dropout under tp forks it)."""

    def __enter__(self):
        self.tracker = get_rng_tracker()
        self.states = self.tracker.get_states()
        if MODEL_PARALLEL_RNG not in self.states:  # the draws on `meta` are no draws
            from deepspeed.accelerator import get_accelerator

            state = get_accelerator().get_rng_state()
            self.tracker.set_states({**self.states, MODEL_PARALLEL_RNG: state})

    def __exit__(self, *exc):
        self.tracker.set_states(self.states)


@contextlib.contextmanager
def standing_for(device: str):
    """`meta` takes `device`'s entries of the cross entropy's device tables and `device`'s
    routes."""
    tables = (cross_entropy.CHUNK_BYTES, cross_entropy.FUSED_PASSES)
    saved = [dict(t) for t in tables]
    for table in tables:
        table.pop("meta", None)
        if device in table:
            table["meta"] = table[device]
    try:
        with DeviceRoutes(device):
            yield
    finally:
        for table, old in zip(tables, saved):
            table.clear()
            table.update(old)


def _counts(groups) -> dict:
    return {g: collections.Counter(g.traffic) for g in groups}


def _traffic_since(groups, before: dict) -> dict[str, int]:
    """Bytes handed to each `{group}_{collective}` since the `before` counts."""
    return {
        f"{g.name}_{kind}": n - before[g][kind]
        for g in groups
        for kind, n in g.traffic.items()
        if n - before[g][kind]
    }


def trace_part(fn, inputs, parameters, *, device: str = "cuda", groups=()) -> PartTrace:
    """What one micro-batch of `fn(inputs)` holds (module docstring); its floating inputs
    get a gradient (tokens do not); `groups`: the `PlannedGroup`s whose traffic to
    report."""
    parameters = list(parameters)
    with SeededTracker(), standing_for(device):
        clear_masks()
        before = _counts(groups)
        with torch.no_grad(), LiveBytes() as nograd:
            fn(grad_inputs(inputs, False))
        nograd_peak = nograd.peak()
        forward_traffic = _traffic_since(groups, before)
        del nograd
        clear_masks()
        before = _counts(groups)
        x = grad_inputs(inputs, True)
        with LiveBytes() as live:
            with SavedBytes(exclude=parameters) as saved:
                out = fn(x)
            forward_ops = live.ops
            outputs = [t for t in _floats(out) if t.requires_grad]
            made = {storage_id(t) for t in _floats(x)}
            kept = {k: n for k, n in saved.sizes.items() if live.records(k)}
            output_alloc = [
                a for t, a in zip(outputs, live.alive(outputs)) if storage_id(t) not in kept
            ]
            grads = [torch.empty_like(t) for t in outputs]
            torch.autograd.backward(outputs, grads)
            del grads
            param_grads = live.alive([p.grad for p in parameters])
            exclude = param_grads + output_alloc
            result = PartTrace(
                saved=sum(kept.values()),
                saves_input=bool(made & set(saved.sizes)),
                input_bytes=_nbytes(_floats(x)),
                output_bytes=_nbytes(outputs),
                forward_peak=live.peak(0, forward_ops),
                backward_peak=live.peak(forward_ops, None, exclude),
                nograd_peak=nograd_peak,
                traffic=_traffic_since(groups, before),
                forward_traffic=forward_traffic,
            )
        for p in parameters:
            p.grad = None
        clear_masks()
    return result
