"""The model copies beside the trained one keep Mamba's `A_log` and `D` fp32 as training does
(`mamba_selective_fp32_params` in a bf16 run):

- DPO's frozen reference engine (`build_reference`): its A_log and D are fp32 and equal the
  policy's, so at the first step the policy's and the reference's log-probabilities agree and
  the DPO loss is -log sigmoid(0) = log 2 (Rafailov et al.'s loss at equal models);
- the inference model's precision (`to_run_precision`, what `generate.py` and `eval.py` use).
"""

from __future__ import annotations

import math

import pytest

from tests.distributed import run_distributed

pytestmark = pytest.mark.slow

SEQ, MICRO, VOCAB = 16, 2, 64
MAMBA = dict(attention_config=[[["mamba"], 2]], norm="rmsnorm", pos_emb="none")


def _config():
    from megatron.config import config_from_dict

    cfg = config_from_dict(
        dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=SEQ,
             max_position_embeddings=SEQ, hidden_dropout=0.0, attention_dropout=0.0,
             pipe_parallel_size=0, zero_optimization={"stage": 1}, precision="bfloat16",
             train_micro_batch_size_per_gpu=MICRO, gradient_accumulation_steps=1,
             optimizer={"type": "Adam", "params": {"lr": 0.01}}, train_iters=2,
             distributed_backend="gloo", **MAMBA),
        vocab_size=VOCAB,
        world_size=1,
    )  # fmt: skip
    return cfg.replace(train_impl="dpo")


def _dpo_first_step(rank, world_size):
    import deepspeed
    import torch

    from megatron.parallel import ParallelTopology
    from megatron.parallel.random import seed_everything
    from megatron.training.objectives import build_objective
    from megatron.training.objectives.reference import build_reference
    from megatron.training.setup.batches import BatchSettings, ModelBatches
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.steps import engine_steps

    deepspeed.init_distributed(dist_backend="gloo")
    cfg = _config()
    topo = ParallelTopology.from_config(cfg)
    goal = build_objective(cfg, topo.tp_group)
    seed_everything(cfg.training.seed)
    reference = build_reference(cfg, topo, goal)
    seed_everything(cfg.training.seed)
    engine = build_engine(cfg, topo, 2, goal).engine

    def marked(module):
        return {n: p for n, p in module.named_parameters() if n.endswith(("A_log", ".D"))}

    ref, policy = marked(reference.engine.module), marked(engine.module)
    equal = sorted(ref) == sorted(policy) and all(torch.equal(ref[n], policy[n]) for n in ref)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, VOCAB, (2 * MICRO, SEQ + 1), generator=g)
    label = tokens.clone()
    label[:, : SEQ // 4] = -100
    sample = dict(pos=tokens[:MICRO], neg=tokens[MICRO:], pos_label=label[:MICRO])
    loss = engine_steps(engine, topo, goal, reference).train_step(
        ModelBatches(iter([sample]), BatchSettings(), None, goal)
    )
    return {
        "dtypes": {str(p.dtype) for p in ref.values()},
        "others": {str(p.dtype) for n, p in reference.engine.module.named_parameters()
                   if n not in ref},
        "equal": equal,
        "loss": float(loss),
    }  # fmt: skip


def test_dpo_reference_keeps_a_log_and_d_fp32_like_the_policy():
    r = run_distributed(_dpo_first_step, 1, timeout=600)[0]
    assert r["dtypes"] == {"torch.float32"} and r["others"] == {"torch.bfloat16"}
    assert r["equal"]
    assert r["loss"] == pytest.approx(math.log(2), rel=1e-6)


def test_inference_precision_keeps_them_fp32():
    import torch

    from megatron.inference.model import to_run_precision
    from megatron.model import ModelArgs, build_model

    cfg = _config()
    model = build_model(cfg)
    to_run_precision(model, torch.device("cpu"), torch.bfloat16)
    kept = {n: p.dtype for n, p in model.named_parameters() if n.endswith(("A_log", ".D"))}
    assert len(kept) == 4 and set(kept.values()) == {torch.float32}
    assert ModelArgs.from_config(cfg).mamba_selective_fp32_params
    others = {p.dtype for n, p in model.named_parameters() if n not in kept}
    assert others == {torch.bfloat16}
