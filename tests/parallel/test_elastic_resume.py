"""Elastic resume (issue 16; gloo, fp32, dropout 0): a run trained 4 steps at layout X, converted
with `tools/reshard.py` (weights and optimizer state, ZeRO partitions included) and resumed at
layout Y for 4 more steps gives the losses of resuming the same checkpoint at X (1e-5
relative), for dp2 ZeRO-1 -> dp1, dp2 ZeRO-2 -> tp2, (pp2, dp2) ZeRO-1 -> (tp2, pp1) ZeRO-0,
dp2 ZeRO-3 (plain engine) -> pp2, and dp2 ZeRO-1 -> dp1 at another global batch size (the
reference then resumes at X with that batch size too).

The global batch stays 8 (micro batch 2 x accumulation x dp) except in the batch-size case,
where both runs use 4. The converted Adam moments equal DeepSpeed's saved ZeRO partitions
element for element: the test rebuilds every data-parallel rank's flat partition from the
converted per-parameter moments by DeepSpeed's partitioning rules and the `param_shapes` it
records, independently of `zero_state.py`.

Three process spawns (4, 2 and 1 ranks) run all the trainings; start-up is the expensive part.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

RUN = dict(hidden_dropout=0.0, attention_dropout=0.0, eval_interval=1000, train_iters=8)
ZERO0 = {"zero_optimization": {"stage": 0}}


def _z(stage: int, pp: int, **more) -> dict:
    return dict(pipe_parallel_size=pp, zero_optimization={"stage": stage}, **more)


# name: (source layout, the case whose checkpoint it resumes, target layout (ZeRO 0; its
# ranks follow from the spawn that runs it), change of the reference's batch).
CASES = {
    "z1_dp1": (_z(1, 1), "z1_dp1", dict(pipe_parallel_size=1, gradient_accumulation_steps=4), {}),
    "z1_batch": (
        _z(1, 1),
        "z1_dp1",
        dict(pipe_parallel_size=1, gradient_accumulation_steps=2),
        dict(gradient_accumulation_steps=1),  # reference at dp2: global batch 4, as the target
    ),
    "z2_tp2": (
        _z(2, 0),
        "z2_tp2",
        dict(pipe_parallel_size=0, model_parallel_size=2, gradient_accumulation_steps=4),
        {},
    ),
    "z3_pp2": (_z(3, 0), "z3_pp2", dict(pipe_parallel_size=2, gradient_accumulation_steps=4), {}),
    "pp2z1_tp2": (  # 4 ranks: the target (tp2, pp1) keeps dp2
        _z(1, 2),
        "pp2z1_tp2",
        dict(pipe_parallel_size=1, model_parallel_size=2),
        {},
    ),
}


def source(tmp, name) -> dict:
    """Train 4 of 8 steps at the source layout; exit_interval saves global_step4."""
    return tiny_settings(tmp / name, exit_interval=4, **RUN, **CASES[name][0])


def at_source(tmp, name) -> dict:
    """The reference: the source checkpoint resumed at the source layout."""
    layout, ckpt, _, change = CASES[name]
    settings = tiny_settings(tmp / ckpt, **RUN, **{**layout, **change})
    return {**settings, "save": None, "log_dir": str(tmp / name / "ref_logs")}


def at_target(tmp, name) -> dict:
    _, ckpt, layout, _ = CASES[name]
    settings = tiny_settings(tmp / f"{name}_out", **RUN, **ZERO0, **layout)
    return {**settings, "load": str(tmp / f"{ckpt}_out" / "ckpt"), "save": None}


def convert(tmp, name) -> None:
    """The product's command line, to the target's (tp, pp)."""
    from tools import reshard as tool

    _, ckpt, layout, _ = CASES[name]
    target = {**tiny_settings(tmp), **layout}
    argv = ["--checkpoint", str(tmp / ckpt / "ckpt"), "--output", str(tmp / f"{ckpt}_out" / "ckpt")]
    argv += ["--model-parallel-size", str(target["model_parallel_size"])]
    assert tool.main(argv + ["--pipe-parallel-size", str(target["pipe_parallel_size"])]) == 0


def _train(rank, world_size, tmp, steps):
    """Run each `(kind, arg)` step: `train` settings, or `convert` a case on rank 0."""
    import torch.distributed as dist

    from megatron.training import pretrain

    out = []
    for kind, arg in steps:
        if kind == "convert":
            if rank == 0:
                convert(tmp, arg)
            dist.barrier()
        else:
            out.append(pretrain(resolve(arg, world_size)).losses)
    return out


def _saved_partitions(folder, mp: int, key: str) -> tuple[int, list[list], list, list]:
    """(ZeRO stage, each dp rank's `key` state by group, DeepSpeed's param_shapes, its
    per-parameter alignment paddings or None) of model-parallel rank `mp`."""
    from megatron.checkpoint.safe_load import load_file

    files = list(folder.glob(f"zero_pp_rank_*_mp_rank_{mp:02d}_optim_states.pt"))
    files.sort(key=lambda p: int(p.name.split("_")[3]))
    saved = [load_file(f) for f in files]
    states = [s["optimizer_state_dict"] for s in saved]
    stage = int(states[0]["zero_stage"])
    if stage == 3:
        model = load_file(folder / f"zero_pp_rank_0_mp_rank_{mp:02d}_model_states.pt")
        torch_states = [s["optimizer_state_dict"]["state"] for s in states]
    else:
        model = load_file(folder / f"mp_rank_{mp:02d}_model_states.pt")
        torch_states = [s["base_optimizer_state"]["state"] for s in states]
    by_group = [[s[i][key] for i in sorted(s)] for s in torch_states]
    shapes = model["param_shapes"]
    paddings = states[0].get("param_alignment_paddings")
    return stage, by_group, shapes if isinstance(shapes, list) else [shapes], paddings


def _flat_group(moments: dict, group: dict, paddings) -> torch.Tensor:
    pieces = []
    for i, name in enumerate(group):
        pieces.append(moments[name])
        if paddings and paddings[i]:
            pieces.append(moments[name].new_zeros(paddings[i]))
    return torch.cat(pieces)


def _check_moments(tmp, name) -> None:
    """Every saved ZeRO partition of the source equals the converted moments re-cut by
    DeepSpeed's rules: ZeRO 1/2, each group's parameters concatenated in `param_shapes`
    order (with their alignment paddings) and cut into dp contiguous pieces of the saved
    partition's size (the end padding not compared); ZeRO 3, each parameter cut into
    ceil(numel / dp) pieces, rank d holding piece d of each, over its sub-groups."""
    from megatron.checkpoint_tools.optimizer_read import read_optimizer_state
    from megatron.checkpoint_tools.reader import CheckpointReader

    converted, why = read_optimizer_state(CheckpointReader(tmp / f"{name}_out" / "ckpt"))
    assert converted is not None, why
    assert all(float(s["step"]) == 4 for s in converted.per_param.values())
    folder = tmp / name / "ckpt" / "global_step4"
    mp_ranks = len(list(folder.glob("zero_pp_rank_0_mp_rank_*_optim_states.pt")))
    compared = 0
    for mp in range(mp_ranks):
        for key in ("exp_avg", "exp_avg_sq"):
            stage, saved, shapes, paddings = _saved_partitions(folder, mp, key)
            moments = {n: s[key].flatten() for n, s in converted.per_param.items()}
            dp = len(saved)
            if stage == 3:
                names = [n for group in shapes for n in group]
                want = [torch.cat([_piece(moments[n], dp, d) for n in names]) for d in range(dp)]
                got = [torch.cat(s) for s in saved]
            else:
                want, got = [[] for _ in range(dp)], [[] for _ in range(dp)]
                for g, group in enumerate(shapes):
                    flat = _flat_group(moments, group, paddings[g] if paddings else None)
                    size = saved[0][g].numel()
                    for d in range(dp):
                        want[d].append(flat[d * size : (d + 1) * size])
                        got[d].append(saved[d][g][: want[d][-1].numel()])
                want, got = [torch.cat(w) for w in want], [torch.cat(g) for g in got]
            for d in range(dp):
                assert torch.equal(want[d], got[d][: want[d].numel()]), (name, mp, key, d)
                compared += want[d].numel()
    total = sum(s["exp_avg"].numel() for s in converted.per_param.values())
    assert compared >= 2 * total, (name, compared, total)


def _piece(flat: torch.Tensor, dp: int, d: int) -> torch.Tensor:
    size = math.ceil(flat.numel() / dp)
    piece = flat[d * size : (d + 1) * size]
    return torch.cat([piece, piece.new_zeros(size - piece.numel())])


def test_resume_at_another_layout_and_zero_stage_matches_resuming_at_the_source(tmp_path):
    name4 = "pp2z1_tp2"
    steps4 = [("train", source(tmp_path, name4)), ("convert", name4)]
    steps4 += [("train", at_source(tmp_path, name4)), ("train", at_target(tmp_path, name4))]
    four = run_distributed(_train, 4, tmp_path, steps4, timeout=1500)[0]

    sources, on_two, on_one = ("z1_dp1", "z2_tp2", "z3_pp2"), ("z2_tp2", "z3_pp2"), ("z1_dp1",)
    refs = ("z1_dp1", "z1_batch", "z2_tp2", "z3_pp2")
    steps = [("train", source(tmp_path, n)) for n in sources]
    steps += [("convert", n) for n in sources]
    steps += [("train", at_source(tmp_path, n)) for n in refs]
    steps += [("train", at_target(tmp_path, n)) for n in on_two]
    two = run_distributed(_train, 2, tmp_path, steps, timeout=1500)[0]
    one_steps = [("train", at_target(tmp_path, n)) for n in (*on_one, "z1_batch")]
    one = run_distributed(_train, 1, tmp_path, one_steps, timeout=900)[0]

    assert len(four[0]) == 4 and all(len(losses) == 4 for losses in two[:3])
    reference = {name4: four[1], **dict(zip(refs, two[3:7]))}
    resumed = {name4: four[2], **dict(zip((*on_two, *on_one, "z1_batch"), two[7:] + one))}
    worst = {}
    for name, losses in resumed.items():
        assert len(losses) == 4 == len(reference[name]), name  # steps 5..8
        worst[name] = max(abs(a - b) / abs(b) for a, b in zip(losses, reference[name]))
        print(f"{name}: max relative loss difference {worst[name]:.2e}")
    assert all(w <= 1e-5 for w in worst.values()), worst
    # The batch-size case really trained on other batches than the unchanged one.
    assert reference["z1_batch"] != pytest.approx(reference["z1_dp1"], rel=1e-3)
    for name in (*sources, name4):
        _check_moments(tmp_path, name)
