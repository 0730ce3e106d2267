"""`pipe_parallel_size: 0`: the plain model under DeepSpeed's ordinary engine equals one process.

One spawn of 4 gloo ranks at tp=2, dp=2 (`deepspeed.initialize(mpu=topology)`):

- ZeRO 0, Pythia-style toy with sequence parallelism: the loss and the gradients the optimizer
  receives (gathered over tp) equal the single-process model's within 1e-5 relative;
- ZeRO 2, Llama-style toy (GQA): one SGD step gives the single-process weights;
- the real parameter count summed over the tensor-parallel shards equals `count_parameters`;
- dropout at tp=2 (seeded by `model_parallel_seed`): the replicated activations stay identical
  on both tensor-parallel ranks, and activation checkpointing replays the masks exactly (same
  loss and gradients as without it).
"""

from __future__ import annotations

import dataclasses

import torch

from megatron.model import (
    build_gpt,
    count_model_parameters,
    count_parameters,
    full_state_dict,
    layer_index,
)
from megatron.parallel import ParallelTopology, is_tensor_parallel, model_parallel_seed
from megatron.parallel.comm import all_gather_along
from tests.distributed import run_distributed
from tests.unit.model.tiny import (
    MICRO_BATCH,
    assert_close,
    llama_args,
    micro_batches,
    neox_args,
    reference_loss_and_grads,
)

LR = 0.1


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it was asked to apply."""

    def step(self, closure=None):
        self.recorded = {
            p: p.grad.detach().clone()
            for group in self.param_groups
            for p in group["params"]
            if p.grad is not None
        }
        return super().step(closure)


def engine_step(args, batches, zero_stage):
    import deepspeed

    topo = ParallelTopology(tp_size=2, pp_size=0)
    model = build_gpt(args, topo)
    optimizer = RecordingSGD(model.parameters(), lr=LR)
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "train_batch_size": MICRO_BATCH * topo.dp_size,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, mpu=topo)
    inputs, labels = batches[topo.dp_rank]
    loss = model.loss_fn(engine(*inputs), labels)
    engine.backward(loss)
    engine.step()
    losses = [torch.zeros(()) for _ in range(topo.dp_size)]
    torch.distributed.all_gather(losses, loss.detach(), group=topo.get_data_parallel_group())
    grads = {}
    if zero_stage == 0:
        grads = {
            name: (
                all_gather_along(optimizer.recorded[p], p.partition_dim, topo.tp_group)
                if is_tensor_parallel(p)
                else optimizer.recorded[p]
            ).numpy()
            for name, p in model.named_parameters()
        }
    weights = {k: v.numpy() for k, v in full_state_dict(model, topo.tp_group).items()}
    return dict(
        loss=torch.stack(losses).mean().item(),
        grads=grads,
        weights=weights,
        count=count_model_parameters(model, topo),
        local_count=sum(p.numel() for p in model.parameters()),
    )


def check_dropout_at_tp2():
    """Asserts on each rank: tp-consistent dropout, exact replay under checkpointing."""
    topo = ParallelTopology(tp_size=2, pp_size=0)
    args = neox_args(hidden_dropout=0.3, attention_dropout=0.3)
    ((inputs, labels),) = micro_batches(args, 1)
    runs = []
    for checkpoint in (False, True):
        model = build_gpt(dataclasses.replace(args, checkpoint_activations=checkpoint), topo)
        final_norm = model.get_submodule(str(layer_index(args, "final_norm")))
        captured = []
        final_norm.register_forward_hook(lambda m, i, out, seen=captured: seen.append(out.detach()))
        model_parallel_seed(7, topo)
        loss = model.loss_fn(model(*inputs), labels)
        loss.backward()
        runs.append((loss.detach(), full_state_dict(model, topo.tp_group, grads=True)))
        # The final hidden state is replicated over tp: both ranks must hold the same one.
        copies = all_gather_along(captured[0].unsqueeze(0), 0, topo.tp_group)
        assert torch.equal(copies[0], copies[1]), "dropout diverged across tensor-parallel ranks"
    (loss, grads), (ckpt_loss, ckpt_grads) = runs
    assert torch.equal(loss, ckpt_loss), "checkpointing changed the loss under dropout"
    for name, grad in grads.items():
        assert torch.equal(grad, ckpt_grads[name]), f"checkpointing changed the grad of {name}"


def _worker(rank, world_size, runs):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    check_dropout_at_tp2()
    return [engine_step(*run) for run in runs]


def test_plain_model_under_deepspeed_engine_matches_single_process():
    neox = neox_args(sequence_parallel=True)
    llama = llama_args()
    runs = [(neox, micro_batches(neox, 2, seed=5), 0), (llama, micro_batches(llama, 2, seed=6), 2)]
    results = run_distributed(_worker, 4, runs, timeout=600)
    for index, (args, batches, zero_stage) in enumerate(runs):
        plain = dataclasses.replace(args, sequence_parallel=False)
        ref_loss, ref_grads, ref_weights = reference_loss_and_grads(plain, batches)
        for result in (r[index] for r in results):
            assert abs(result["loss"] - ref_loss) <= 1e-5 * abs(ref_loss), f"ZeRO {zero_stage}"
            assert result["count"] == count_parameters(args)
            assert result["local_count"] < count_parameters(args)  # really sharded
            for name, grad in result["grads"].items():
                assert_close(torch.from_numpy(grad), ref_grads[name], f"gradient of {name}")
            assert len(result["grads"]) == (len(ref_grads) if zero_stage == 0 else 0)
            for name, weight in result["weights"].items():
                stepped = ref_weights[name] - LR * ref_grads[name]
                assert_close(torch.from_numpy(weight), stepped, f"ZeRO {zero_stage}: {name}")
