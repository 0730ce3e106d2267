"""Elastic resume onto ZeRO 1-3 (issue 16; gloo, 4 ranks, dropout 0): a run trained 4 steps at
(pp2, dp2) ZeRO-1 is converted by `tools/reshard.py --zero-stage` into DeepSpeed's universal
layout and resumed through DeepSpeed's own `load_universal` path for 4 more steps:

- fp32: to (plain engine, dp4) ZeRO-2 and to (tp2, pp1, dp2) ZeRO-1; the losses equal resuming
  the same checkpoint at the source layout within 1e-5 relative;
- bf16 (DeepSpeed's bf16 optimizer at the source, its ZeRO optimizer at the target): to (plain
  engine, dp4) ZeRO-2, losses within 1e-3 (bf16 sums in another order);
- fp32 to (plain engine, dp4) ZeRO-3 (DeepSpeed's ZeRO-3 universal loader, with
  `CheckpointIO`'s fix-ups: each parameter group's own hyperparameters, one step tensor per
  sub-group), losses within 1e-5;
- fp32 from (tp2, plain engine, dp2) ZeRO-3, whose weights exist only in the partitions of
  two model-parallel ranks, to (tp1, pp1, dp4) ZeRO-1, losses within 1e-5.

The global batch stays 8 (micro batch 2 x accumulation x dp). Inside each target engine, right
after `CheckpointIO.load`, every parameter's fp32 master weight and Adam moments, read through
DeepSpeed's `safe_get_full_*` accessors, equal element for element what DeepSpeed itself
restores from the source checkpoint at the source layout (cut to the rank's tensor-parallel
shard), every step count is 4 (one tensor per flat group) and each parameter group has its
own weight decay. One spawn runs it all (start-up is the expensive part).
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

RUN = dict(hidden_dropout=0.0, attention_dropout=0.0, eval_interval=1000, train_iters=8)
SOURCE = dict(pipe_parallel_size=2, zero_optimization={"stage": 1}, gradient_accumulation_steps=2)
PLAIN_DP4_ZERO2 = dict(
    pipe_parallel_size=0, zero_optimization={"stage": 2}, gradient_accumulation_steps=1
)
TP2_PP1_ZERO1 = dict(
    model_parallel_size=2,
    pipe_parallel_size=1,
    zero_optimization={"stage": 1},
    gradient_accumulation_steps=2,
)
PP1_DP4_ZERO1 = dict(
    pipe_parallel_size=1, zero_optimization={"stage": 1}, gradient_accumulation_steps=1
)
# source: (its changes to SOURCE, {target: layout on 4 ranks, global batch kept at 8},
# loss tolerance)
CASES = {
    "fp32": (
        {},
        {
            "plain_dp4_zero2": PLAIN_DP4_ZERO2,
            "tp2_pp1_zero1": TP2_PP1_ZERO1,
            "plain_dp4_zero3": {**PLAIN_DP4_ZERO2, "zero_optimization": {"stage": 3}},
        },
        1e-5,
    ),
    # ZeRO-3 at tp 2: its weights exist only in the partitions of two model-parallel ranks.
    "zero3_tp2": (
        dict(model_parallel_size=2, pipe_parallel_size=0, zero_optimization={"stage": 3}),
        {"pp1_dp4_zero1": PP1_DP4_ZERO1},
        1e-5,
    ),
    # DeepSpeed's bf16 optimizer at the source (pipeline, fp32 accumulation), its ZeRO
    # optimizer at the target; bf16 sums in another order, so the losses agree less closely.
    "bf16": ({"precision": "bfloat16"}, {"plain_dp4_zero2": PLAIN_DP4_ZERO2}, 1e-3),
}
KEYS = ("fp32", "exp_avg", "exp_avg_sq")


def _settings(folder, **changes):
    return tiny_settings(folder, **RUN, **changes)


def _convert(source, output, layout) -> None:
    """The product's command line."""
    from tools import reshard as tool

    layout = {**tiny_settings(output), **layout}
    argv = ["--checkpoint", str(source), "--output", str(output)]
    argv += ["--model-parallel-size", str(layout["model_parallel_size"])]
    argv += ["--pipe-parallel-size", str(layout["pipe_parallel_size"])]
    assert tool.main(argv + ["--zero-stage", str(layout["zero_optimization"]["stage"])]) == 0


def _engine_state(cfg) -> tuple[dict, int, int]:
    """Build the engine as `pretrain` does, load `cfg`'s checkpoint through `CheckpointIO.load`
    and return what DeepSpeed holds: ({name: {fp32, exp_avg, exp_avg_sq}} of this rank's
    shards, gathered over its ZeRO fragments by DeepSpeed's `safe_get_full_*`), tp, tp rank."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.checkpoint.checkpoint_io import CheckpointIO
    from megatron.training.setup.engine import build_engine

    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed + 1)  # other initial weights than the saved ones
    engine = build_engine(cfg, topology, cfg.training.train_iters).engine
    assert CheckpointIO(engine, None).load(cfg.checkpointing.load)["iteration"] == 4
    states = list(engine.optimizer.optimizer.state.values())
    assert {float(s["step"]) for s in states} == {4.0}
    # torch's Adam adds 1 to `step` in place: a tensor shared by two flat groups would count
    # two steps per step
    assert len({id(s["step"]) for s in states}) == len(states)
    decay = {g["name"]: g["weight_decay"] for g in engine.optimizer.optimizer.param_groups}
    assert decay == {"decay": cfg.optimizer.weight_decay, "no_decay": 0.0}
    # DeepSpeed points each parameter at its piece of the optimizer's flat state only at the
    # first step; its own linking, done now, makes `safe_get_full_optimizer_state` read the
    # state the next step will use.
    getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", lambda: None)()
    held = {}
    for name, param in engine.module.named_parameters():
        held[name] = {"fp32": safe_get_full_fp32_param(param).cpu()}
        for key in KEYS[1:]:
            held[name][key] = safe_get_full_optimizer_state(param, key).cpu()
    return held, cfg.parallel.model_parallel_size, topology.tp_rank


def _source_truth(cfg) -> dict:
    """Every parameter's full state as DeepSpeed restores the source checkpoint at its own
    layout, gathered from every rank (tensor-parallel shards joined along the dim the model's
    layers split)."""
    import torch.distributed as dist

    from megatron.checkpoint_tools.schema import ModelSchema
    from megatron.model import ModelArgs

    held, tp, tp_rank = _engine_state(cfg)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (held, tp_rank))
    shards: dict = {}
    for rank_held, rank in gathered:
        for name, state in rank_held.items():
            shards.setdefault(name, {})[rank] = state
    schema = ModelSchema(ModelArgs.from_config(cfg))
    truth = {}
    for name, by_rank in shards.items():
        assert sorted(by_rank) == list(range(tp)), (name, sorted(by_rank))
        parts = [by_rank[r] for r in range(tp)]
        truth[name] = {k: schema.merge(name, [p[k] for p in parts]) for k in KEYS}
    return truth


def _compare(cfg, held: dict, tp: int, rank: int, truth: dict) -> int:
    """Values compared; each equals the source's state (vocabulary padded for the target)
    cut to this tensor-parallel rank along the dim the model's layers split."""
    from megatron.checkpoint_tools.schema import ModelSchema, resize_vocab
    from megatron.model import ModelArgs

    schema = ModelSchema(ModelArgs.from_config(cfg))  # the target model
    compared = 0
    for name, state in held.items():
        spec = schema.spec(name)
        for key in KEYS:
            full = truth[name][key]
            full = resize_vocab(full, spec.shape[0]) if spec.is_vocab_table else full
            dim = spec.partition_dim
            want = full if dim is None else full.chunk(tp, dim)[rank]
            assert torch.equal(state[key], want), (name, key)
            compared += want.numel()
    return compared


def _run(rank, world_size, tmp):
    import torch.distributed as dist

    from megatron.training import pretrain

    out = {}
    for case, (changes, targets, _) in CASES.items():
        folder = tmp / case
        source = {**SOURCE, **changes}
        precision = {k: v for k, v in changes.items() if k == "precision"}
        pretrain(resolve(_settings(folder / "source", exit_interval=4, **source), 4))
        ckpt = folder / "source" / "ckpt"
        reference = resolve(_settings(folder / "ref", **source, load=str(ckpt), save=None), 4)
        truth = _source_truth(reference)
        out[case] = {"reference": pretrain(reference).losses}
        for name, layout in targets.items():
            if rank == 0:
                _convert(ckpt, folder / name / "ckpt", layout)
            dist.barrier()
            cfg = resolve(_settings(folder / name, **layout, **precision, save=None), 4)
            out[case][f"{name} compared"] = _compare(cfg, *_engine_state(cfg), truth)
            out[case][name] = pretrain(cfg).losses
    return out


def test_resume_converted_checkpoint_with_zero_1_and_2_at_another_layout(tmp_path):
    results = run_distributed(_run, 4, tmp_path, timeout=1500)
    for case, (_, targets, tolerance) in CASES.items():
        reference = results[0][case]["reference"]
        assert len(reference) == 4
        for name in targets:
            losses = results[0][case][name]
            worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
            print(f"{case} -> {name}: max relative loss difference {worst:.2e}")
            assert losses == pytest.approx(reference, rel=tolerance), (case, name)
            assert all(r[case][f"{name} compared"] > 0 for r in results), (case, name)
