"""Expert parallelism under ZeRO-1/2 on 4 gloo ranks equals the single-process model.

One spawn runs, through `deepspeed.initialize` with the product's expert parameter groups and
ZeRO hook (`megatron/training/step/moe_grads.py`: `expert_param_groups`,
`zero_partitions_experts`) and the product's step drivers, a 4-layer toy with experts on
layers 0 and 2 (4 experts, top-2, load-balancing and z losses on) at ep 2:

- ep2 x dp4, ZeRO-1 and ZeRO-2, plain engine (expert-data-parallel groups [0,2] [1,3]);
- ep2 x pp2 (dp 2), ZeRO-1, pipeline engine, Sinkhorn router.

Against the single-process model and `torch.optim.AdamW` on the same micro-batches (fp32,
dropout 0, weight decay on matrices, eps 1e-5, gradient clipping at a norm the gradients
exceed): the losses of 3 steps, the gradient norm of the first step (whole model: the experts
of every rank counted once), the weights after those steps (all within 1e-5); the experts
each rank holds (`E / ep`), and that ZeRO partitions the expert groups over the 2 ranks of
the expert-data-parallel group (the dense groups over all data-parallel ranks) with each
rank's fp32 master partition 1/2 of its experts.

Then at ep2 x dp4 with ZeRO-2: 2 steps, a checkpoint, 2 more; a fresh engine (another seed)
loads it and repeats the last 2 steps bit for bit (losses and every weight), with expert rank
1's experts in `expert_states_pp0_ep1.pt` and each rank's ZeRO partitions in its own file.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron.model import build_gpt, full_state_dict
from megatron.model.moe import Experts, moe_layers
from megatron.model.param_groups import param_groups
from megatron.parallel import ParallelTopology
from megatron.training.checkpoint.checkpoint_io import CheckpointIO
from megatron.training.checkpoint.experts import ExpertCheckpoint
from megatron.training.step.moe_grads import (
    expert_param_groups,
    install_expert_grad_reduction,
    prepare_moe_step,
    register_expert_groups,
    zero_partitions_experts,
)
from megatron.training.step.steps import engine_steps
from tests.distributed import run_distributed
from tests.parallel.test_moe_parallel import EP, EXPERTS, _expert_slice, _full, _mine, moe_args
from tests.unit.model.tiny import MICRO_BATCH, assert_close, micro_batches

# Adam divides each gradient by its own running magnitude, so the summation-order rounding of
# a near-zero gradient (another reduction order than one process's) would become an update of
# order `lr`; an eps above that rounding bounds it by `lr * rounding / eps`.
STEPS, LR, WD, CLIP, EPS = 3, 1e-2, 0.1, 0.05, 1e-5


def _engine(model, topo, gas, stage):
    """Optimizer and engine set up as `engine_setup.build_engine` does for ZeRO `stage`."""
    import deepspeed
    from deepspeed.pipe import PipelineModule

    groups = expert_param_groups(param_groups(model, WD), stage)
    optimizer = torch.optim.AdamW(groups, lr=LR, weight_decay=WD, eps=EPS)
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": gas,
        "train_batch_size": MICRO_BATCH * gas * topo.dp_size,
        "steps_per_print": 10**9,
        "gradient_clipping": CLIP,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    register_expert_groups(topo)
    mpu = None if isinstance(model, PipelineModule) else topo
    with zero_partitions_experts(stage):
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, mpu=mpu)
    install_expert_grad_reduction(engine, model, topo)
    return engine


def _partitions(engine):
    """(partition count, fp32 partition numel, parameter numel) of each expert group, and the
    partition counts of the dense groups."""
    zero = engine.optimizer
    moe, dense = [], []
    for i, group in enumerate(zero.optimizer.param_groups):
        if group.get("moe"):
            numel = sum(p.numel() for p in zero.bit16_groups[i])  # the group's parameters
            part = zero.single_partition_of_fp32_groups[i].numel()
            moe.append((zero.partition_count[i], part, numel))
        else:
            dense.append(zero.partition_count[i])
    return moe, dense


def run_layout(args, pp, stage, batches):
    topo = ParallelTopology(tp_size=1, pp_size=pp, ep_size=EP)
    model = build_gpt(args, topo)
    gas, mine = _mine(batches, topo)
    engine = _engine(model, topo, gas, stage)
    steps = engine_steps(engine, topo)
    losses, norms = [], []
    for _ in range(STEPS):
        losses.append(steps.train_step(iter(mine)))
        norms.append(float(engine.get_global_grad_norm()))
    weights = {n: _full(p, p.detach(), topo) for n, p in model.named_parameters()}
    experts = [layer.experts for layer in moe_layers(model)]
    moe, dense = _partitions(engine)
    return dict(
        losses=losses,
        norm=norms[0],
        first={n: m.first for n, m in model.named_modules() if isinstance(m, Experts)},
        local_experts=[e.w_in.shape[0] for e in experts],
        expert_numel=sum(p.numel() for e in experts for p in e.parameters()),
        moe_partitions=moe,
        dense_partitions=dense,
        weights={n: w.numpy().copy() for n, w in weights.items()} if topo.dp_rank < EP else {},
    )


def resume_run(args, batches, folder):
    topo = ParallelTopology(tp_size=1, pp_size=0, ep_size=EP)
    gas, mine = _mine(batches, topo)

    def build(seed):
        model = build_gpt(dataclasses.replace(args, seed=seed), topo)
        engine = _engine(model, topo, gas, 2)
        experts = ExpertCheckpoint(engine.module, engine.optimizer, topo)
        io = CheckpointIO(engine, folder, {"moe_expert_parallel_size": EP}, experts=experts)
        return engine, io, engine_steps(engine, topo)

    engine, io, steps = build(args.seed)
    for _ in range(2):
        steps.train_step(iter(mine))
    saved = io.save(2, {"consumed_samples": 0})
    losses = [steps.train_step(iter(mine)) for _ in range(2)]
    final = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    engine, io, steps = build(args.seed + 1)
    io.load(folder)
    again = [steps.train_step(iter(mine)) for _ in range(2)]
    return dict(
        losses=(losses, again),
        exact=all(torch.equal(final[n], p) for n, p in engine.module.named_parameters()),
        experts=sorted(f.name for f in saved.glob("expert_states_*")),
        zero=sorted(f.name for f in saved.glob("*optim_states.pt")),
    )


def _worker(rank, world_size, layouts, resume):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    return [run_layout(*layout) for layout in layouts], resume_run(*resume)


def reference(args, batches):
    """Single process, AdamW with the product's weight-decay groups, clipped like DeepSpeed:
    the losses, the first step's gradient norm and the final weights."""
    model = build_gpt(dataclasses.replace(args, pipe_parallel_size=0, moe_expert_parallel_size=1))
    optimizer = torch.optim.AdamW(param_groups(model, WD), lr=LR, weight_decay=WD, eps=EPS)
    losses, norms = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        prepare_moe_step(model, len(batches))
        loss = sum(model.loss_fn(model(*x), y) for x, y in batches) / len(batches)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        losses.append(loss.item())
    return losses, norms[0], full_state_dict(model)


def check(per_rank, args, batches, dp):
    losses, norm, ref_weights = reference(args, batches)
    assert norm > CLIP, "the reference gradients must be clipped for the norm to matter"
    for r in per_rank:
        for got, want in zip(r["losses"], losses, strict=True):
            assert abs(got - want) <= 1e-5 * abs(want), ("losses", r["losses"], losses)
        assert abs(r["norm"] - norm) <= 1e-5 * norm, ("gradient norm", r["norm"], norm)
        assert r["local_experts"] and all(n == EXPERTS // EP for n in r["local_experts"])
        assert r["dense_partitions"] and set(r["dense_partitions"]) == {dp}
        held = sum(numel for _count, _part, numel in r["moe_partitions"])
        assert held == r["expert_numel"] > 0, "expert groups hold this rank's experts"
        for count, part, numel in r["moe_partitions"]:  # over the expert-data group only
            assert count == dp // EP and numel <= part * count < numel + 64 * count
    seen = set()
    for r in per_rank:
        for name, weight in r["weights"].items():
            expected = _expert_slice(name, ref_weights[name], r)
            assert_close(torch.from_numpy(weight), expected, name)
            seen.add(name)
    assert seen == set(ref_weights), f"never compared: {set(ref_weights) - seen}"


@pytest.mark.slow
def test_expert_parallel_with_zero_matches_single_process_and_resumes(tmp_path):
    plain = moe_args(pipe_parallel_size=0)
    piped = moe_args(pipe_parallel_size=2, moe_router_type="sinkhorn")
    layouts = [
        (plain, 0, 1, micro_batches(plain, 4, seed=0)),
        (plain, 0, 2, micro_batches(plain, 4, seed=1)),
        (piped, 2, 1, micro_batches(piped, 4, seed=2)),
    ]
    resume = (plain, micro_batches(plain, 4, seed=7), str(tmp_path / "ckpt"))
    results = run_distributed(_worker, 4, layouts, resume, timeout=1200)
    for i, (args, pp, _stage, batches) in enumerate(layouts):
        per_rank = [results[rank][0][i] for rank in range(4)]
        check(per_rank, args, batches, dp=4 if pp == 0 else 2)
    for rank in range(4):
        resumed = results[rank][1]
        assert resumed["losses"][0] == resumed["losses"][1], f"rank {rank}: resumed losses"
        assert resumed["exact"], f"rank {rank}: weights after the resumed steps differ"
        assert resumed["experts"] == ["expert_states_pp0_ep1.pt"], resumed["experts"]
        assert len(resumed["zero"]) == 4, resumed["zero"]
