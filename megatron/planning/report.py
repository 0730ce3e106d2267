"""The plan as a table for the console and as JSON with every term named, in bytes."""

from __future__ import annotations

from megatron.planning.plan import RunPlan, StagePlan
from megatron.planning.states import Term

GIB = 2**30


def gib(nbytes: float) -> str:
    """GiB, or MiB below a tenth of one."""
    if abs(nbytes) < GIB / 10:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes / GIB:.2f} GiB"


PHASE_ORDER = ("forward", "backward", "reduce", "step")


def _phases(term: Term) -> list[str]:
    return [p for p in PHASE_ORDER if p in term.phases]


def _layers(stage: StagePlan) -> str:
    if stage.layers is None:
        return "-"
    first, last = stage.layers
    return str(first) if first == last else f"{first}-{last}"


def _fit(plan: RunPlan, stage: StagePlan) -> str:
    memory = plan.machine.memory
    if memory is None:
        return "-"
    share = stage.total / memory
    return f"{'yes' if share <= 1 else 'NO'} ({share:.0%})"


def stage_table(plan: RunPlan) -> list[str]:
    header = (f"  {'stage':>5} {'layers':>8} {'params':>9} {'states':>11} {'activations':>12} "
              f"{'kept':>10} {'peak in':>11} {'allocated':>11} {'total':>11}  fits")  # fmt: skip
    lines = [header]
    for s in plan.stages:
        other, states = s.reference + sum(s.buffers.values()), s.states.persistent
        lines.append(
            f"  {s.index:>5} {_layers(s):>8} {s.parameters / 1e6:>8.1f}M {gib(states):>11} "
            f"{gib(s.activations.peak):>12} {gib(other):>10} {s.peak_phase:>11} "
            f"{gib(s.allocated):>11} {gib(s.total):>11}  {_fit(plan, s)}"
        )  # fmt: skip
    return lines


def _term_lines(terms: list[Term]) -> list[str]:
    lines = []
    for t in terms:
        when = f"  ({', '.join(_phases(t))})" if t.phases else ""
        lines.append(f"      {t.name:<44} {gib(t.bytes):>11}{when}")
    return lines


def breakdown(plan: RunPlan, stage: StagePlan) -> list[str]:
    acts, mb = stage.activations, stage.activations.microbatch
    lines = [f"  heaviest rank: stage {stage.index}, {plan.wrapper}"]
    lines.append("    model states (kept through the run; transients with their phases)")
    lines += _term_lines(list(stage.states.terms))
    if stage.states.host:
        lines.append("    in the CPU's memory (offloaded)")
        lines += _term_lines(list(stage.states.host))
    if stage.reference:
        lines.append(f"    frozen reference model's weights           {gib(stage.reference):>11}")
    for name, nbytes in stage.buffers.items():
        if nbytes:
            lines.append(f"    {name:<46} {gib(nbytes):>11}")
    lines.append(
        f"    activations: {gib(mb.held)} kept per micro-batch, {acts.in_flight} in flight"
    )
    lines.append(
        f"      one micro-batch's most: {gib(mb.forward)} in its forward ({mb.forward_in}),"
    )
    lines.append(f"      {gib(mb.backward)} in its backward ({mb.backward_in})")
    for phase, nbytes in stage.phases.items():
        lines.append(f"    peak of the {phase:<34} {gib(stage.persistent + nbytes):>11}")
    for name, nbytes in stage.allowances.items():
        lines.append(f"    + {name} (assumed)".ljust(51) + f"{gib(nbytes):>11}")
    return lines


def step_lines(plan: RunPlan) -> list[str]:
    step = plan.step
    if step is None:
        why = "a CPU" if plan.machine.device == "cpu" else "no known peak (peak_theoretical_tflops)"
        return [f"  step time: no estimate ({why})"]
    peak = plan.machine.peak_tflops
    lines = [
        f"  step time (an estimate: {step.mfu:.0%} of {peak:g} TFLOP/s per GPU, nothing overlapped)"
    ]
    lines.append(
        f"      {'compute':<40} {step.compute_s:>9.3f} s  (pipeline idle {step.bubble:.0%})"
    )
    for t in step.comm:
        volume = f"{t.bytes / 1e9:.2f} GB per rank over {t.link}, {t.gb_per_s:g} GB/s"
        lines.append(f"      {t.name:<40} {t.seconds:>9.3f} s  ({volume})")
    lines.append(f"      {'step':<40} {step.seconds:>9.3f} s  ({step.tokens_per_s:,.0f} tokens/s; "
                 f"largest: {step.dominant})")  # fmt: skip
    return lines


def render(plan: RunPlan, advice: list[str] = ()) -> str:
    """The console table of the plan."""
    L, m = plan.layout, plan.machine
    memory = gib(m.memory) if m.memory is not None else "unknown memory"
    lines = [f"memory plan, per rank ({m.name}, {memory}; from {m.source}):"]
    lines.append(
        f"  world {L.world} = dp {L.dp} x pp {L.pp} x tp {L.tp}"
        + (f" (ep {L.ep})" if L.ep > 1 else "")
        + f"; micro batch {L.micro_batch} x {L.micro_batches} per step, sequence {L.seq}, "
        f"{L.dtype}, ZeRO {L.zero_stage}"
    )
    lines += stage_table(plan)
    lines += breakdown(plan, plan.heaviest)
    lines += step_lines(plan)
    if plan.fits is False:
        need = gib(plan.heaviest.total)
        lines.append(f"  does NOT fit: stage {plan.heaviest.index} needs {need} of {memory}")
    lines += [f"  to fit: {a}" for a in advice]
    lines += [f"  assumed: {a}" for a in plan.assumptions]
    return "\n".join(lines)


def _terms(terms) -> dict:
    return {t.name: {"bytes": t.bytes, "phases": _phases(t)} for t in terms}


def stage_json(stage: StagePlan) -> dict:
    acts, mb = stage.activations, stage.activations.microbatch
    return {
        "stage": stage.index,
        "layers": list(stage.layers) if stage.layers else None,
        "parameters": stage.parameters,
        "model_states": _terms(stage.states.terms),
        "offloaded_to_cpu": _terms(stage.states.host),
        "reference_model": stage.reference,
        "kept_buffers": dict(stage.buffers),
        "activations": {
            "kept_per_microbatch": mb.held,
            "microbatches_in_flight": acts.in_flight,
            "microbatch_forward_peak": mb.forward,
            "microbatch_forward_peak_in": mb.forward_in,
            "microbatch_backward_peak": mb.backward,
            "microbatch_backward_peak_in": mb.backward_in,
            "peak": acts.peak,
            "parts": [
                {"name": u.name, "kept": u.held, "forward": u.forward, "backward": u.backward}
                for u in acts.units
            ],  # fmt: skip
            "tensor_parallel_traffic_per_microbatch": dict(acts.traffic),
        },
        "persistent": stage.persistent,
        "phases": stage.phases,
        "peak_phase": stage.peak_phase,
        "allocated": stage.allocated,
        "allowances": dict(stage.allowances),
        "total": stage.total,
    }


def to_json(plan: RunPlan, advice: list[str] = ()) -> dict:
    """The plan with every term named, in bytes (seconds for the step estimate)."""
    m, step = plan.machine, plan.step
    return {
        "machine": {
            "device": m.device,
            "name": m.name,
            "memory": m.memory,
            "peak_tflops": m.peak_tflops,
            "source": m.source,
            "nvlink_gb_per_s": m.links.nvlink,
            "network_gb_per_s": m.links.network,
            "gpus_per_node": m.links.gpus_per_node,
        },  # fmt: skip
        "layout": vars(plan.layout),
        "wrapper": plan.wrapper,
        "stages": [stage_json(s) for s in plan.stages],
        "heaviest_stage": plan.heaviest.index,
        "fits": plan.fits,
        "step_time": None
        if step is None
        else {
            "estimate": True,
            "mfu": step.mfu,
            "flops": step.flops,
            "compute_s": step.compute_s,
            "pipeline_idle": step.bubble,
            "communication": [
                {
                    "name": t.name,
                    "bytes_per_rank": t.bytes,
                    "link": t.link,
                    "gb_per_s": t.gb_per_s,
                    "seconds": t.seconds,
                }
                for t in step.comm
            ],
            "seconds": step.seconds,
            "tokens_per_s": step.tokens_per_s,
            "largest": step.dominant,
        },  # fmt: skip
        "advice": list(advice),
        "assumptions": list(plan.assumptions),
    }
