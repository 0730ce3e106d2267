"""Expert parallelism with DeepSpeed engines on 4 gloo ranks equals the single-process model.

One spawn runs three layouts of a 4-layer toy with experts on layers 0 and 2 (4 experts,
top-2, load-balancing and z losses on), each through `deepspeed.initialize` with the product's
expert-group registration and expert-gradient reduction (`megatron/training/step/moe_grads.py`)
and the product's step drivers (`steps.py`):

- ep2 x tp2 (plain engine, dp 2): experts split over the two data-parallel ranks, every
  expert whole on both tensor-parallel ranks;
- ep2 x pp2 (pipeline engine, dp 2), Sinkhorn router: one MoE layer per stage, each stage's
  router loss backpropagated through its own layers;
- ep2 x dp4 (plain engine) with token dropping: expert gradients averaged over the
  expert-data-parallel groups [0,2] [1,3].

Against the single-process model on the same micro-batches (fp32, dropout 0, clipping off):
the eval and train losses, every gradient the optimizer receives (the expert slice a rank
holds), the weights after three more SGD steps (all within 1e-5), the logged router losses,
and the expert parameters each rank holds (`E / ep` experts, really sharded), with the
parameter count over all ranks equal to the analytic one.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron.model import build_gpt, count_model_parameters, count_parameters, full_state_dict
from megatron.model.moe import Experts, moe_layers
from megatron.parallel import ParallelTopology, is_tensor_parallel
from megatron.parallel.comm import all_gather_along
from megatron.training.checkpoint.checkpoint_io import CheckpointIO
from megatron.training.checkpoint.experts import ExpertCheckpoint
from megatron.training.step.moe_grads import (
    install_expert_grad_reduction,
    prepare_moe_step,
    register_expert_groups,
)
from megatron.training.step.steps import engine_steps
from tests.distributed import run_distributed
from tests.unit.model.tiny import MICRO_BATCH, assert_close, micro_batches, neox_args

EXPERTS, EP, STEPS, LR = 4, 2, 3, 0.5


class RecordingSGD(torch.optim.SGD):
    """SGD keeping the gradients of its first step."""

    def step(self, closure=None):
        if not hasattr(self, "recorded"):
            self.recorded = {
                p: p.grad.detach().clone()
                for group in self.param_groups
                for p in group["params"]
                if p.grad is not None
            }
        return super().step(closure)


def moe_args(**overrides):
    values = dict(
        moe_num_experts=EXPERTS,
        moe_top_k=2,
        moe_router_type="topk",
        moe_aux_loss_coeff=0.1,
        moe_z_loss_coeff=0.01,
        moe_expert_parallel_size=EP,
        moe_expert_interval=2,  # experts on layers 0 and 2 of 4
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    values.update(overrides)
    return neox_args(**values)


def _full(p, tensor, topo):
    return (
        all_gather_along(tensor, p.partition_dim, topo.tp_group)
        if is_tensor_parallel(p)
        else tensor
    )


def _engine(model, optimizer, topo, gas):
    """A DeepSpeed engine set up as `engine_setup.build_engine` does for experts."""
    import deepspeed
    from deepspeed.pipe import PipelineModule

    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": gas,
        "train_batch_size": MICRO_BATCH * gas * topo.dp_size,
        "steps_per_print": 10**9,
        "gradient_clipping": 0.0,
    }
    register_expert_groups(topo)
    mpu = None if isinstance(model, PipelineModule) else topo
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, mpu=mpu)
    install_expert_grad_reduction(engine, model, topo)
    return engine


def _mine(batches, topo):
    gas = len(batches) // topo.dp_size
    return gas, batches[topo.dp_rank * gas : (topo.dp_rank + 1) * gas]


def run_layout(args, tp, pp, batches):
    topo = ParallelTopology(tp_size=tp, pp_size=pp, ep_size=EP)
    model = build_gpt(args, topo)
    gas, mine = _mine(batches, topo)
    optimizer = RecordingSGD(model.parameters(), lr=LR)
    engine = _engine(model, optimizer, topo, gas)
    steps = engine_steps(engine, topo)
    eval_loss = steps.eval_step(iter(mine))
    train_loss = steps.train_step(iter(mine))
    logged = {key: float(value) for key, value in steps.moe_losses.items()}  # device tensors
    grads = {n: _full(p, optimizer.recorded[p], topo) for n, p in model.named_parameters()}
    for _ in range(STEPS):
        steps.train_step(iter(mine))
    weights = {n: _full(p, p.detach(), topo) for n, p in model.named_parameters()}
    experts = [layer.experts for layer in moe_layers(model)]
    keep = topo.tp_rank == 0 and topo.dp_rank < EP  # one rank per expert slice
    return dict(
        eval_loss=eval_loss,
        train_loss=train_loss,
        logged=logged,
        first={n: m.first for n, m in model.named_modules() if isinstance(m, Experts)},
        local_experts=[e.w_in.shape[0] for e in experts],
        expert_numel=sum(p.numel() for e in experts for p in e.parameters()),
        expert_names=[n for n, p in model.named_parameters() if ".mlp.experts." in n],
        count=count_model_parameters(model, topo),
        grads={n: g.numpy().copy() for n, g in grads.items()} if keep else {},
        weights={n: w.numpy().copy() for n, w in weights.items()} if keep else {},
    )


def resume_run(args, batches, folder):
    """Train 2 steps, save, train 2; a fresh engine (another seed) loads and trains 2."""
    topo = ParallelTopology(tp_size=1, pp_size=0, ep_size=EP)
    gas, mine = _mine(batches, topo)

    def build(seed):
        model = build_gpt(dataclasses.replace(args, seed=seed), topo)
        engine = _engine(model, torch.optim.AdamW(model.parameters(), lr=1e-2), topo, gas)
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
        files=sorted(f.name for f in saved.glob("expert_states_*")),
    )


def _worker(rank, world_size, layouts, resume):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    return [run_layout(*layout) for layout in layouts], resume_run(*resume)


def reference(args, batches):
    """Single process: losses, first gradients, weights after STEPS more SGD steps, and the
    router losses of the first step (summed over layers, mean over micro-batches)."""
    model = build_gpt(dataclasses.replace(args, pipe_parallel_size=0, moe_expert_parallel_size=1))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    def step():
        optimizer.zero_grad()
        prepare_moe_step(model, len(batches))
        loss = sum(model.loss_fn(model(*x), y) for x, y in batches) / len(batches)
        loss.backward()
        return loss.item()

    with torch.no_grad():
        model.eval()
        eval_loss = (sum(model.loss_fn(model(*x), y) for x, y in batches) / len(batches)).item()
        model.train()
    loss = step()
    layers = moe_layers(model)
    logged = {
        "moe_aux_loss": float(sum(m.moe_loss_sums["aux"] / m.moe_loss_sums["n"] for m in layers)),
        "moe_z_loss": float(sum(m.moe_loss_sums["z"] / m.moe_loss_sums["n"] for m in layers)),
    }
    grads = full_state_dict(model, grads=True)
    optimizer.step()
    for _ in range(STEPS):
        step()
        optimizer.step()
    return eval_loss, loss, logged, grads, full_state_dict(model)


def _expert_slice(name, tensor, result):
    """The reference rows of the experts a rank holds (expert tensors only)."""
    if ".mlp.experts." not in name:
        return tensor
    first = result["first"][name.rsplit(".", 1)[0]]  # of the `Experts` module holding `name`
    return tensor[first : first + EXPERTS // EP]


def check(per_rank, args, batches):
    eval_loss, loss, logged, ref_grads, ref_weights = reference(args, batches)
    total = count_parameters(args)
    for r in per_rank:
        assert abs(r["eval_loss"] - eval_loss) <= 1e-5 * abs(eval_loss), "eval loss"
        assert abs(r["train_loss"] - loss) <= 1e-5 * abs(loss), "train loss"
        assert r["local_experts"] and all(n == EXPERTS // EP for n in r["local_experts"])
        assert r["count"] == total, "parameters over all ranks"
        for key, value in logged.items():
            assert abs(r["logged"][key] - value) <= 1e-5 * max(abs(value), 1e-8), key
    for r in per_rank:  # 1/ep of the full expert tensors of its stage: really sharded
        full = sum(ref_weights[n].numel() for n in r["expert_names"])
        assert r["expert_numel"] * EP == full and full > 0, "expert shard"
    seen = set()
    for r in per_rank:
        for name, grad in r["grads"].items():
            expected = _expert_slice(name, ref_grads[name], r)
            assert_close(torch.from_numpy(grad), expected, f"gradient of {name}")
            weight = torch.from_numpy(r["weights"][name])
            assert_close(weight, _expert_slice(name, ref_weights[name], r), f"{name}")
            seen.add(name)
    assert seen == set(ref_grads), f"never compared: {set(ref_grads) - seen}"


@pytest.mark.slow
def test_expert_parallel_layouts_match_single_process(tmp_path):
    plain = moe_args(pipe_parallel_size=0)
    piped = moe_args(pipe_parallel_size=2, moe_router_type="sinkhorn")
    dropping = moe_args(
        pipe_parallel_size=0,
        moe_token_dropping=True,
        moe_min_capacity=1,
        moe_train_capacity_factor=1.0,
        moe_eval_capacity_factor=1.0,
    )
    batches = [micro_batches(a, 4, seed=i) for i, a in enumerate((plain, piped, dropping))]
    layouts = [
        (plain, 2, 0, batches[0]),
        (piped, 1, 2, batches[1]),
        (dropping, 1, 0, batches[2]),
    ]
    resume = (dropping, micro_batches(dropping, 4, seed=7), str(tmp_path / "ckpt"))
    results = run_distributed(_worker, 4, layouts, resume, timeout=900)
    for i, (args, _tp, _pp, layout_batches) in enumerate(layouts):
        per_rank = [results[rank][0][i] for rank in range(4)]
        check(per_rank, args, layout_batches)
    for rank in range(4):
        resumed = results[rank][1]
        assert resumed["losses"][0] == resumed["losses"][1], f"rank {rank}: resumed losses"
        assert resumed["exact"], f"rank {rank}: weights after the resumed steps differ"
        assert resumed["files"] == ["expert_states_pp0_ep1.pt"], resumed["files"]
