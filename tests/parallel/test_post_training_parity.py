"""DPO and KTO at tp × pp × dp equal the single-process run (fp32, within 1e-5).

Everything goes through the product: the config, `build_reference` (the frozen reference
engine), `build_engine` with the objective's loss, `ModelBatches` turning in-memory pairwise or
reward samples into the objective's inputs, and `engine_steps`. One spawn of 4 gloo ranks runs
the layouts one after the other: (tp2, pp2), (tp2, dp2) with ZeRO-1, (pp2, dp2) with ZeRO-1 and
activation checkpointing, and for DPO (dp4) with ZeRO-3; a spawn of 1 rank runs the same steps
at (tp1, pp0, dp1) from the full logits, where every layout above takes the fused head and loss
(`loss_chunk_tokens`, ZeRO-3 included). Compared: the loss of each of 3 train steps, the
objective's logged metrics, and the loss and metrics of an evaluation after them. Also in bf16
(DPO at (tp2, pp2), KTO at (tp2, dp2) with ZeRO-1), within bf16's rounding (2e-2) of the fp32
run.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import run_distributed

SEQ, MICRO, MICRO_BATCHES, STEPS, VOCAB = 16, 2, 4, 3, 64
LAYOUTS = {  # (tp, pp, zero, checkpoint_activations, precision)
    "tp2_pp2": (2, 2, 0, False, "fp32"),
    "tp2_dp2": (2, 0, 1, False, "fp32"),
    "pp2_dp2": (1, 2, 1, True, "fp32"),
    "dp4_zero3": (1, 0, 3, False, "fp32"),
    "tp2_pp2_bf16": (2, 2, 0, False, "bfloat16"),
    "tp2_dp2_bf16": (2, 0, 1, False, "bfloat16"),
}
ONLY = {"dp4_zero3": "dpo", "tp2_pp2_bf16": "dpo", "tp2_dp2_bf16": "kto"}


def _config(objective, tp, pp, zero, checkpointing, precision, world):
    from megatron.config import config_from_dict

    dp = world // (tp * max(pp, 1))
    cfg = config_from_dict(
        dict(
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            seq_length=SEQ,
            make_vocab_size_divisible_by=16,  # the same padded vocabulary at tp 1 and 2
            max_position_embeddings=SEQ,
            pos_emb="rotary",
            hidden_dropout=0.0,
            attention_dropout=0.0,
            model_parallel_size=tp,
            pipe_parallel_size=pp,
            zero_optimization={"stage": zero},
            checkpoint_activations=checkpointing,
            precision=precision,
            train_micro_batch_size_per_gpu=MICRO,
            gradient_accumulation_steps=MICRO_BATCHES // dp,
            # eps of the order of the gradients: updates follow them smoothly (no sign flips
            # of near-zero gradients between layouts)
            optimizer={"type": "Adam", "params": {"lr": 0.01, "eps": 0.01}},
            weight_decay=0.0,
            warmup=0.0,
            lr_decay_style="constant",
            gradient_clipping=0.0,
            train_iters=STEPS,
            seed=5,
            distributed_backend="gloo",
            # the single-process reference reads the full logits; every layout takes the fused
            # head and loss (the default), in 16-token chunks (4 a micro-batch), but bf16 on
            # the pipeline engine, where it is refused (`groups/model.py::pipeline_bf16`)
            loss_chunk_tokens=0 if world == 1 or (pp and precision == "bfloat16") else 16,
        ),
        vocab_size=VOCAB,
        world_size=world,
    )
    return cfg.replace(train_impl=objective, kto_desirable_weight=1.0, kto_undesirable_weight=1.5)


def _samples(objective, step, index):
    """Micro-batch `index` of global step `step`: the same on every layout."""
    g = torch.Generator().manual_seed(1000 * step + index)
    tokens = torch.randint(1, VOCAB, (2 * MICRO, SEQ + 1), generator=g)
    label = tokens.clone()
    label[:, : SEQ // 4] = -100  # a prompt without loss
    if objective == "dpo":
        return dict(pos=tokens[:MICRO], neg=tokens[MICRO:], pos_label=label[:MICRO])
    reward = torch.tensor([1.0, -1.0] * (MICRO // 2))[:, None].expand(MICRO, SEQ + 1)
    return dict(text=tokens[:MICRO], label=label[:MICRO], reward=reward.contiguous())


def run_layout(objective, tp, pp, zero, checkpointing, precision, world):
    from megatron.parallel import ParallelTopology
    from megatron.parallel.random import seed_everything
    from megatron.training.objectives import build_objective
    from megatron.training.objectives.reference import build_reference
    from megatron.training.setup.batches import BatchSettings, ModelBatches
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.steps import engine_steps

    cfg = _config(objective, tp, pp, zero, checkpointing, precision, world)
    topo = ParallelTopology.from_config(cfg)
    goal = build_objective(cfg, topo.tp_group)
    seed_everything(cfg.training.seed)
    reference = build_reference(cfg, topo, goal)
    seed_everything(cfg.training.seed)
    engine = build_engine(cfg, topo, STEPS, goal).engine
    steps = engine_steps(engine, topo, goal, reference)
    gas = MICRO_BATCHES // topo.dp_size
    mine = range(topo.dp_rank * gas, (topo.dp_rank + 1) * gas)

    def batches(step):
        samples = iter([_samples(objective, step, i) for i in mine])
        return ModelBatches(samples, BatchSettings(), None, goal)

    losses, metrics = [], []
    for step in range(STEPS):
        losses.append(steps.train_step(batches(step)))
        step_metrics = steps.objective_metrics.items()  # device (mean, present) pairs
        metrics.append({k: float(v[0]) for k, v in step_metrics if v[1]})
    eval_loss = steps.eval_step(batches(STEPS))
    return dict(losses=losses, metrics=metrics, eval=(eval_loss, steps.take_metrics()))


def _worker(rank, world_size, runs):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    return [run_layout(*run, world_size) for run in runs]


def _runs(objective):
    names = [name for name in LAYOUTS if ONLY.get(name, objective) == objective]
    return [(objective, *LAYOUTS[name]) for name in names]


@pytest.mark.slow
def test_dpo_and_kto_equal_the_single_process_run_at_every_layout():
    objectives = ("dpo", "kto")
    alone = [(o, 1, 0, 0, False, "fp32") for o in objectives]
    single = run_distributed(_worker, 1, alone, timeout=600)[0]
    runs = [run for o in objectives for run in _runs(o)]
    parallel = run_distributed(_worker, 4, runs, timeout=900)
    expected = dict(zip(objectives, single))
    for i, run in enumerate(runs):
        want = expected[run[0]]
        tol = 1e-5 if run[-1] == "fp32" else 2e-2
        for rank, results in enumerate(parallel):
            got = results[i]
            where = f"{run} rank {rank}"
            assert got["losses"] == pytest.approx(want["losses"], abs=tol), where
            assert got["eval"][0] == pytest.approx(want["eval"][0], abs=tol), where
            logged = zip(got["metrics"] + [got["eval"][1]], want["metrics"] + [want["eval"][1]])
            for ours, theirs in logged:
                assert ours.keys() == theirs.keys() and ours, where
                for key in ours:
                    assert ours[key] == pytest.approx(theirs[key], abs=tol), (where, key)
    # the policy learns: the loss changes over the steps
    assert expected["dpo"]["losses"][0] != pytest.approx(expected["dpo"]["losses"][-1], abs=1e-4)
