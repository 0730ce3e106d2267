"""A reward model (`train_impl: rm`) through DeepSpeed's pipeline engine equals one process.

One spawn of 4 gloo ranks, two layouts, each `deepspeed.initialize` on `build_gpt` with the
rm objective installed as the model's loss (chosen and rejected rows of a pair in one
micro-batch, so they meet on the last stage):

- (tp=2, pp=2): Pythia-style toy (tied embedding, which the value head does not use);
- (tp=2, dp=2) with sequence parallelism: Llama-style toy, the value head gathering the
  sequence before its replicated weight.

`train_batch`'s loss, the gradients the optimizer receives (gathered over tp) and the step's
metrics (`accuracy`, `margin`, ... reduced over the ranks) must equal the single-process model
and objective within 1e-5 relative (fp32); the value head's weight and gradient must be the
same on both tensor-parallel ranks.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from megatron.model import PIPELINE_SP_CONFIG, build_gpt, full_state_dict
from megatron.parallel import ParallelTopology, is_tensor_parallel
from megatron.parallel.comm import all_gather_along
from megatron.training.objectives.rm import RewardModel
from megatron.training.setup.batches import BatchSettings
from tests.distributed import run_distributed
from tests.unit.model.tiny import SEQ, assert_close, llama_args, neox_args
from tests.unit.training.test_rm_objective import pair_samples

pytestmark = pytest.mark.slow

PAIRS = 2  # pairs per micro-batch: 2 * PAIRS rows


def objective() -> RewardModel:
    return RewardModel(SimpleNamespace(model=SimpleNamespace(z_loss=0.01)))


def micro_batches(args, count: int, seed: int):
    lengths = [
        [(3 + (5 * i + j) % (SEQ - 3), 1 + (7 * i + 3 * j) % SEQ) for j in range(PAIRS)]
        for i in range(count)
    ]
    return [
        objective().model_inputs(pair_samples(args, ls, seed + i), BatchSettings())
        for i, ls in enumerate(lengths)
    ]


class RecordingSGD(torch.optim.SGD):
    def step(self, closure=None):
        self.recorded = {
            p: p.grad.detach().clone()
            for g in self.param_groups
            for p in g["params"]
            if p.grad is not None
        }
        return super().step(closure)


def run_engine(args, topo, batches, ds_extra):
    import deepspeed

    model = build_gpt(args, topo)
    rm = objective()
    rm.install(model)
    gas = len(batches) // topo.dp_size
    mine = batches[topo.dp_rank * gas : (topo.dp_rank + 1) * gas]
    optimizer = RecordingSGD(model.parameters(), lr=0.1)
    config = {
        "train_micro_batch_size_per_gpu": 2 * PAIRS,
        "gradient_accumulation_steps": gas,
        "train_batch_size": 2 * PAIRS * gas * topo.dp_size,
        "steps_per_print": 10**9,
        "gradient_clipping": 0.0,
        **ds_extra,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    loss = engine.train_batch(iter(mine)).item()
    metrics = rm.metrics.reduce(topo)
    grads = {}
    for name, p in model.named_parameters():
        g = optimizer.recorded[p]
        grads[name] = (
            all_gather_along(g, p.partition_dim, topo.tp_group) if is_tensor_parallel(p) else g
        )
    head = [p for n, p in model.named_parameters() if n.endswith("score.weight")]
    head_copies = [
        all_gather_along(t[None], 0, topo.tp_group).numpy()
        for p in head
        for t in (p.detach(), optimizer.recorded[p])
    ]
    keep = topo.tp_rank == 0 and topo.dp_rank == 0
    return dict(
        loss=loss,
        metrics=metrics,
        grads={n: g.numpy().copy() for n, g in grads.items()} if keep else {},
        head_copies=head_copies,
    )


def _worker(rank, world_size, layouts):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    return [
        run_engine(args, ParallelTopology(tp_size=tp, pp_size=pp), batches, extra)
        for args, tp, pp, batches, extra in layouts
    ]


def reference(args, batches):
    model = build_gpt(dataclasses.replace(args, pipe_parallel_size=0, sequence_parallel=False))
    rm = objective()
    loss = sum(rm.loss(model(*inputs), labels) for inputs, labels in batches) / len(batches)
    loss.backward()
    return loss.item(), rm.metrics.reduce(), full_state_dict(model, grads=True)


def test_reward_model_pipeline_matches_single_process():
    neox = neox_args(value_head=True, pipe_parallel_size=2)
    llama = llama_args(value_head=True, pipe_parallel_size=1, sequence_parallel=True)
    layouts = [
        (neox, 2, 2, micro_batches(neox, 2, seed=1), {}),
        (llama, 2, 1, micro_batches(llama, 4, seed=2), {"pipeline": PIPELINE_SP_CONFIG}),
    ]
    results = run_distributed(_worker, 4, layouts, timeout=800)
    for index, (args, *_rest) in enumerate(layouts):
        batches = layouts[index][3]
        ref_loss, ref_metrics, ref_grads = reference(args, batches)
        per_rank = [r[index] for r in results]
        for result in per_rank:  # replicated over tp: identical weight and gradient copies
            for copies in result["head_copies"]:
                assert (copies == copies[:1]).all(), "value head differs between tp ranks"
        # A gradient that sums to near zero (the final norm's bias, ~1e-7) rounds at the size
        # of the model's gradients, not its own: errors count against the largest of them.
        largest = max(g.abs().max().item() for g in ref_grads.values())
        seen = set()
        for result in per_rank:
            # The mean rewards sit near 0 (a sum of signed values): their rounding is absolute
            # (~1e-8 here, on an AMD EPYC), so a purely relative tolerance of 1e-5 is too tight.
            assert result["metrics"] == pytest.approx(ref_metrics, rel=1e-5, abs=1e-7)
            for name, grad in result["grads"].items():
                expected, what = ref_grads[name], f"gradient of {name}"
                assert_close(torch.from_numpy(grad), expected, what, floor=largest)
                seen.add(name)
        assert seen == set(ref_grads)
        losses = [r["loss"] for r in per_rank]
        assert all(abs(x - ref_loss) <= 1e-5 * abs(ref_loss) for x in losses), (losses, ref_loss)
