"""The whole model through DeepSpeed's pipeline engine equals the single-process model.

Each layout is one spawn of 4 gloo ranks running `deepspeed.initialize` on `build_gpt(...)`:
`eval_batch` and `train_batch` losses and the gradients the optimizer receives (recorded in its
`step`, gathered over tensor-parallel ranks) must equal the plain single-process model's loss
and gradients for the same weights and batch within 1e-5 relative (fp32). The weights agree
before any step because every layer is built from its own seed whatever the layout.

- (tp=2, pp=2): Pythia-style toy, embedding tied across the first and last stage; after
  more optimizer steps the two copies of the tied embedding are still identical. The same
  spawn then runs it again with activation checkpointing and partitioned activations: the
  gradients must not change, and every transformer layer must really run twice.
- (tp=2, pp=1, dp=2): Llama-style toy (GQA, untied head); gradients are averaged over the
  two data-parallel replicas, each fed half of the micro-batches. Then again with sequence
  parallelism (norm gradients summed over tp by the hooks `build_gpt` registers).
- (tp=2, pp=2) with sequence parallelism, DeepSpeed's pipeline activation partitioning off.
- (tp=1, pp=2, dp=2): RWKV layers mixed with attention (`rwkv` in `attention_config`, as
  GPT-NeoX builds them: no tensor parallelism), recomputed under activation checkpointing.

Construction alone (4 stages) checks that `pipe_partition_method` reaches DeepSpeed: one
transformer layer per stage with `type:transformer`, two layers with `uniform`.

Every layout also counts the parameters it built across tp x pp ranks (tied copy once): the
count equals `count_parameters`; and the global gradient norm summed over `owned_parameters`
equals the single-process one (DeepSpeed's own fp32 clipping norm does not, for pp > 1).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron.model import (
    PIPELINE_SP_CONFIG,
    build_gpt,
    count_model_parameters,
    count_parameters,
    full_state_dict,
    owned_parameters,
)
from megatron.model.specs import TRANSFORMER_LAYER_NAMES
from megatron.parallel import ParallelTopology, is_tensor_parallel
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

TIED = "tied_modules.embed.word_embeddings.weight"
# With sequence parallelism the activations sent between stages are already split over tp
# (each tp rank holds another chunk); DeepSpeed's default `pipe_partitioned` would split them
# again as if they were replicated and reassemble the wrong halves. See PIPELINE_SP_CONFIG.
NO_PIPE_SPLIT = {"pipeline": PIPELINE_SP_CONFIG}
RWKV_MIX = ("rwkv", "global", "rwkv", "rwkv")


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


def full_tensor(p, tensor, tp_group):
    return all_gather_along(tensor, p.partition_dim, tp_group) if is_tensor_parallel(p) else tensor


def run_engine(args, topo, batches, extra_steps, ds_overrides=None):
    """One engine: eval loss, first train loss, recorded full grads, weights, tied copies."""
    import deepspeed

    model = build_gpt(args, topo)
    gas = len(batches) // topo.dp_size
    mine = batches[topo.dp_rank * gas : (topo.dp_rank + 1) * gas]
    optimizer = RecordingSGD(model.parameters(), lr=0.5)
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": gas,
        "train_batch_size": MICRO_BATCH * gas * topo.dp_size,
        "steps_per_print": 10**9,
        # DeepSpeed defaults to clipping at 1.0; the gradients are compared unclipped.
        "gradient_clipping": 0.0,
        **(ds_overrides or {}),
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    weights = full_state_dict(model, topo.tp_group)
    eval_loss = engine.eval_batch(iter(mine)).item()
    calls = []
    hooks = [
        m.register_forward_hook(lambda *_: calls.append(1))
        for m in model.modules()
        if type(m).__name__ in TRANSFORMER_LAYER_NAMES
    ]
    train_loss = engine.train_batch(iter(mine)).item()
    for hook in hooks:
        hook.remove()
    grads = {
        name: full_tensor(p, optimizer.recorded[p], topo.tp_group)
        for name, p in model.named_parameters()
    }
    norm_sq = sum(optimizer.recorded[p].pow(2).sum() for p in owned_parameters(model, topo))
    norm_sq = torch.as_tensor(norm_sq, dtype=torch.float32).reshape(1)
    for group in (topo.tp_group, topo.pp_group):
        if group is not None:
            torch.distributed.all_reduce(norm_sq, group=group)
    for _ in range(extra_steps):
        engine.train_batch(iter(mine))
    tied = {
        name: full_tensor(p, p.detach(), topo.tp_group)
        for name, p in model.named_parameters()
        if name == TIED
    }
    keep = topo.tp_rank == 0 and topo.dp_rank == 0
    return dict(
        eval_loss=eval_loss,
        train_loss=train_loss,
        grads=as_numpy(grads) if keep else {},
        weights=as_numpy(weights) if keep else {},
        tied=as_numpy(tied) if keep else {},
        stage=topo.pp_rank,
        count=count_model_parameters(model, topo),
        grad_norm=norm_sq.sqrt().item(),
        # transformer-layer forwards per micro-batch and layer (2 when recomputed)
        forwards_per_layer=len(calls) / max(1, len(hooks) * gas),
        sequence_parallel_params=sum(
            bool(getattr(p, "sequence_parallel", False)) for p in model.parameters()
        ),
    )


def as_numpy(tensors: dict) -> dict:
    """Tensors leave the worker as numpy arrays (torch would share them through file
    descriptors that die with the worker process)."""
    return {name: t.detach().numpy().copy() for name, t in tensors.items()}


def stage_bounds(args, methods):
    """`PipelineModule.parts` (stage boundaries in the layer list) per partition method."""
    topo = ParallelTopology(tp_size=1, pp_size=4)
    return {
        method: build_gpt(dataclasses.replace(args, pipe_partition_method=method), topo).parts
        for method in methods
    }


def _worker(rank, world_size, layouts, partition_methods):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    results = []
    for args, tp, pp, batches, extra_steps, *ds_overrides in layouts:
        topo = ParallelTopology(tp_size=tp, pp_size=pp)
        results.append(run_engine(args, topo, batches, extra_steps, *ds_overrides))
    results.append(stage_bounds(layouts[0][0], partition_methods))
    return results


def check_layout(per_rank, args, batches):
    plain = dataclasses.replace(args, checkpoint_activations=False)
    ref_loss, ref_grads, ref_weights = reference_loss_and_grads(plain, batches)
    for result in per_rank:
        assert abs(result["eval_loss"] - ref_loss) <= 1e-5 * abs(ref_loss), "eval_batch loss"
        assert abs(result["train_loss"] - ref_loss) <= 1e-5 * abs(ref_loss), "train_batch loss"
    assert all(r["count"] == count_parameters(args) for r in per_rank), "parameter count"
    ref_norm = torch.cat([g.flatten() for g in ref_grads.values()]).norm().item()
    for result in per_rank:  # the global norm over `owned_parameters` (what clipping needs)
        assert abs(result["grad_norm"] - ref_norm) <= 1e-5 * ref_norm, "gradient norm"
    recomputed = 2.0 if args.checkpoint_activations else 1.0
    assert all(r["forwards_per_layer"] == recomputed for r in per_rank), "checkpointing"
    if args.sequence_parallel:
        assert all(r["sequence_parallel_params"] > 0 for r in per_rank), "sequence parallel"
    seen = set()
    for result in per_rank:
        for name, weight in result["weights"].items():
            assert torch.equal(torch.from_numpy(weight), ref_weights[name]), f"weight {name}"
        for name, grad in result["grads"].items():
            where = f"gradient of {name} (stage {result['stage']})"
            assert_close(torch.from_numpy(grad), ref_grads[name], where)
            seen.add(name)
    assert seen == set(ref_grads), f"parameters never compared: {set(ref_grads) - seen}"


GMLP_MIX = ("gmlp", "amlp", "global", "amlp")  # gMLP blocks (tp 1 only) between attention


def test_pipeline_engine_matches_single_process():
    neox = neox_args(pipe_parallel_size=2)
    neox_ckpt = dataclasses.replace(neox, checkpoint_activations=True, partition_activations=True)
    llama = llama_args(pipe_parallel_size=1)
    llama_sp = dataclasses.replace(llama, sequence_parallel=True)
    neox_batches, llama_batches = micro_batches(neox, 2, seed=1), micro_batches(llama, 4, seed=2)
    layouts = [
        (neox, 2, 2, neox_batches, 3),
        (neox_ckpt, 2, 2, neox_batches, 0),
        (llama, 2, 1, llama_batches, 0),
        (llama_sp, 2, 1, llama_batches, 0),
        (dataclasses.replace(neox, sequence_parallel=True), 2, 2, neox_batches, 0, NO_PIPE_SPLIT),
        (dataclasses.replace(neox_ckpt, layer_attention_types=RWKV_MIX), 1, 2, neox_batches, 0),
        (dataclasses.replace(neox, pos_emb="rpe", rpe_num_buckets=8), 2, 2, neox_batches, 0),
        (dataclasses.replace(neox_ckpt, layer_attention_types=GMLP_MIX), 1, 2, neox_batches, 0),
    ]
    methods = ["type:transformer", "uniform", "parameters"]
    results = run_distributed(_worker, 4, layouts, methods, timeout=600)
    for index, (args, _tp, _pp, batches, *_rest) in enumerate(layouts):
        check_layout([r[index] for r in results], args, batches)
    # GPT-NeoX's layer list: embedding, _pre_transformer_block, 4 transformer layers (2..5),
    # _post_transformer_block, final norm, head; `type:transformer` matches the layers and
    # both functions' names (weights 0 1 1 1 1 1 1 0 0), as in a GPT-NeoX run.
    bounds = results[0][-1]
    assert bounds["type:transformer"] == [0, 3, 5, 6, 9]
    assert bounds["uniform"] == [0, 3, 5, 7, 9]  # nine entries of any kind
    assert bounds["parameters"][0] == 0 and bounds["parameters"][-1] == 9
    assert bounds["parameters"] != bounds["uniform"]  # the embedding's weight counts
    # Tied embedding: one copy on the first stage, one on the last, still identical.
    copies = [torch.from_numpy(r[0]["tied"][TIED]) for r in results if r[0]["tied"]]
    assert len(copies) == 2, "expected the tied embedding on the first and the last stage"
    assert torch.equal(copies[0], copies[1]), "tied embedding copies diverged"
    assert not torch.equal(copies[0], torch.from_numpy(results[0][0]["weights"][TIED])), (
        "the optimizer steps should have moved the tied embedding"
    )


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
