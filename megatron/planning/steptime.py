"""An estimate of a step's time: the matrix work at an assumed efficiency, and each
collective's volume over its link. An estimate, labelled as one wherever it is shown.

- Compute: the step's FLOPs (`megatron/training/metrics/flops.py::step_work`: 3 × the
  forward, a reference model's forward for DPO/KTO; plus, under activation checkpointing, the
  layers' forward again, which the hardware runs though MFU does not count it) over the
  world's dense peak times `plan_mfu`; DeepSpeed's 1F1B pipeline stands idle for
  `(pp - 1) / m` of it (m micro-batches per step), so it is stretched by `(m + pp - 1) / m`.
- Communication: the bytes each rank sends per step in each kind of collective, over the
  link its group crosses (NVLink within a node, the network between nodes), by ring
  algorithms: an all-reduce of N bytes over t ranks sends `2 (t - 1) / t · N` per rank, an
  all-gather `(t - 1)` times its shard, a reduce-scatter `(t - 1) / t · N`.
- The estimate adds them, as if nothing overlapped; DeepSpeed overlaps part of the
  data-parallel reduction with the backward (`overlap_comm`), so the sum is an upper end.
"""

from __future__ import annotations

import dataclasses

from megatron.training.metrics.flops import forward_flops_per_token, shape_from_config, step_work


def ring_bytes(kind: str, nbytes: float, ranks: int) -> float:
    """Bytes one rank sends in a ring collective handed `nbytes` (module docstring)."""
    if ranks <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (ranks - 1) / ranks * nbytes
    if kind == "all_gather":
        return (ranks - 1) * nbytes
    if kind in ("reduce_scatter", "broadcast"):
        return (ranks - 1) / ranks * nbytes
    if kind == "send":
        return float(nbytes)
    raise ValueError(f"no ring volume for collective '{kind}'")


@dataclasses.dataclass(frozen=True)
class CommTerm:
    """One kind of communication per step and rank."""

    name: str
    bytes: float
    link: str
    gb_per_s: float

    @property
    def seconds(self) -> float:
        return self.bytes / (self.gb_per_s * 1e9)


@dataclasses.dataclass(frozen=True)
class StepTime:
    flops: float
    """FLOPs the hardware runs per step, all ranks (recomputation included)."""
    compute_s: float
    """At `mfu` of the peak, pipeline idle time included."""
    bubble: float
    """The fraction of the compute time the pipeline stands idle."""
    comm: list[CommTerm]
    tokens: int
    mfu: float

    @property
    def seconds(self) -> float:
        return self.compute_s + sum(t.seconds for t in self.comm)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def dominant(self) -> str:
        """The largest term's name."""
        terms = [("compute", self.compute_s), *((t.name, t.seconds) for t in self.comm)]
        return max(terms, key=lambda term: term[1])[0]


def estimate(
    *,
    flops: float,
    tokens: int,
    world: int,
    peak_tflops: float,
    mfu: float,
    pp: int,
    micro_batches: int,
    comm: list[CommTerm],
) -> StepTime:
    """The step time of the module docstring."""
    stretch = (micro_batches + pp - 1) / micro_batches if pp > 1 else 1.0
    busy = flops / (world * peak_tflops * 1e12 * mfu)
    return StepTime(flops, busy * stretch, 1 - 1 / stretch, comm, tokens, mfu)


@dataclasses.dataclass(frozen=True)
class Links:
    """Per-GPU bandwidths, GB/s one direction, and how many GPUs share a node."""

    nvlink: float
    network: float
    gpus_per_node: int

    def over(self, span: int) -> tuple[str, float]:
        """The link a group of ranks spread over `span` consecutive ranks crosses."""
        if span <= self.gpus_per_node:
            return "NVLink", self.nvlink
        return "network", self.network


DP_VOLUME = {
    "torch optimizer": ("all_reduce", 1),
    "FP16_UnfusedOptimizer": ("all_reduce", 1),
    "BF16_Optimizer": ("all_reduce", 1),
    "DeepSpeedZeroOptimizer": ("reduce_scatter", 2),  # the gradients, then the weights gathered
    "DeepSpeedZeroOptimizer_Stage3": ("reduce_scatter", 3),  # and the weights twice
}
"""Per wrapper: the collective whose ring volume the data-parallel exchange is counted in, and
how many of it a step makes over the rank's gradients or weights."""


def communication(
    *,
    tp: int,
    dp: int,
    pp: int,
    ep: int,
    micro_batches: int,
    traffic: dict[str, int],
    boundary_bytes: int,
    dp_bytes: int,
    wrapper: str,
    links: Links,
) -> list[CommTerm]:
    """Each collective's bytes per step and rank, over its link (module docstring).

    `traffic`: the traced bytes each `{group}_{collective}` is handed per micro-batch (the
    heaviest stage's); `boundary_bytes`: a micro-batch's activations between two stages;
    `dp_bytes`: the rank's gradients in the dtype they are reduced in."""
    terms = []
    sizes = {"tensor": (tp, tp), "expert": (ep, tp * ep)}  # (ranks, span of consecutive ranks)
    for key, nbytes in sorted(traffic.items()):
        group, kind = key.split("_", 1)
        ranks, span = sizes[group]
        link, speed = links.over(span)
        moved = ring_bytes(kind, nbytes, ranks) * micro_batches
        terms.append(CommTerm(f"{group}-parallel {kind.replace('_', '-')}", moved, link, speed))
    if pp > 1:
        link, speed = links.over(tp * dp * pp)
        moved = 2 * boundary_bytes * micro_batches  # activations forward, gradients back
        terms.append(CommTerm("pipeline send/recv", moved, link, speed))
    if dp > 1 and wrapper in DP_VOLUME:
        kind, times = DP_VOLUME[wrapper]
        link, speed = links.over(tp * dp)
        moved = times * ring_bytes(kind, dp_bytes, dp)
        terms.append(CommTerm("data-parallel gradients and weights", moved, link, speed))
    return terms


def step_flops(cfg, objective) -> tuple[float, int]:
    """FLOPs the hardware runs per step (all ranks) and the tokens trained on: the model FLOPs
    of `step_work`, under activation checkpointing the layers' forward once more (the output
    head is not recomputed there), and for DPO/KTO with `loss_chunk_tokens` the head's forward
    once more (`linear_log_probs` recomputes each chunk's logits in the backward; the
    language-model loss does not)."""
    work = step_work(cfg, objective)
    flops = work.flops
    shape = shape_from_config(cfg)
    head = 2 * shape.hidden_size * shape.vocab_size
    if cfg.model.checkpoint_activations:
        flops += work.tokens * (forward_flops_per_token(shape) - head)
    if cfg.model.loss_chunk_tokens and not objective.language_model:
        flops += work.tokens * head
    return flops, work.tokens
