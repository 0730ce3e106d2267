"""A bf16 config trains the same on the plain engine and the pipeline engine (one rank).

Twenty steps of four micro-batches each, dropout off, the same data: the losses of
pipe_parallel_size 0 and 1 agree. At ZeRO 1 both accumulate micro-batch gradients in fp32 in
DeepSpeed's BF16_Optimizer (the plain engine's ZeRO optimizer used to accumulate in bf16, 1e-4
apart from step 2 on): the same numbers. At ZeRO 0 both accumulate in bf16 (DeepSpeed has no fp32
accumulation there) and wrap differently, so they agree to bf16's rounding; the plain engine's
wrapper no longer steps the optimizer once over zero gradients as it builds (4e-2 apart at
step 2 before), which the optimizer's own step count shows.
"""

from __future__ import annotations

import pytest

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

STEPS = 20


def _train(folder, loss_chunk_tokens=0, **layout):
    """(losses of `STEPS` steps, the wrapped optimizer's Adam step count after them)."""
    from megatron.data import build_tokenizer
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.batches import BatchSettings
    from megatron.training.setup.data import BatchFactory, build_datasets
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.steps import engine_steps

    # loss_chunk_tokens 0: the full logits on both engines (bf16's default differs between
    # them, `megatron/config/groups/model.py::pipeline_bf16`), so only the engines differ
    settings = tiny_settings(folder, save=None, load=None, train_iters=STEPS, precision="bfloat16",
                             gradient_accumulation_steps=4, hidden_dropout=0.0,
                             attention_dropout=0.0, loss_chunk_tokens=loss_chunk_tokens,
                             **layout)  # fmt: skip
    cfg = resolve(settings, 1)
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    parts = build_engine(cfg, topology, STEPS)
    steps = engine_steps(parts.engine, topology)
    batch = BatchSettings.from_config(cfg, build_tokenizer(cfg).eod)
    batches = BatchFactory(cfg, topology, batch, parts.engine.device)
    batches = batches(build_datasets(cfg, STEPS)[0], 0)
    losses = [float(steps.train(batches)) for _ in range(STEPS)]
    counts = {int(s["step"]) for s in parts.optimizer.state.values()}
    return losses, counts


def _both_engines(rank, world_size, folder):
    out = {}
    for pp in (0, 1):
        for zero in (0, 1):
            layout = dict(pipe_parallel_size=pp, zero_optimization={"stage": zero})
            out[pp, zero] = _train(f"{folder}/{pp}_{zero}", **layout)
    for zero in (0, 1):  # the plain engine's default in bf16: the fused head and loss
        layout = dict(pipe_parallel_size=0, zero_optimization={"stage": zero})
        out["fused", zero] = _train(f"{folder}/fused_{zero}", loss_chunk_tokens=16, **layout)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return run_distributed(_both_engines, 1, str(tmp_path_factory.mktemp("bf16")), timeout=600)[0]


def test_zero1_plain_and_pipeline_engines_train_the_same(trained):
    plain, pipeline = trained[0, 1][0], trained[1, 1][0]
    assert plain == pytest.approx(pipeline, rel=1e-6, abs=0)
    assert pipeline[-1] < pipeline[0] - 1  # it trained


def test_zero0_plain_and_pipeline_engines_agree_to_bf16_rounding(trained):
    plain, pipeline = trained[0, 0][0], trained[1, 0][0]
    assert plain[:2] == pipeline[:2]  # the first update is the same
    assert plain == pytest.approx(pipeline, abs=1e-3, rel=0)


@pytest.mark.parametrize("zero", [0, 1])
def test_the_fused_head_trains_as_the_full_logits_on_the_plain_engine(trained, zero):
    """DeepSpeed's bf16 optimizers receive the head's gradient from the fused loss (on the
    pipeline engine `BF16_Optimizer` lost it, `pipeline_bf16`): the same losses to bf16's
    rounding."""
    fused, full = trained["fused", zero][0], trained[0, zero][0]
    assert fused == pytest.approx(full, abs=2e-3, rel=0)


def test_every_optimizer_counts_only_the_steps_it_took(trained):
    for layout, (_, counts) in trained.items():
        assert counts == {STEPS}, layout
