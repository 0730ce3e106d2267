"""`torch_compile: true` trains to the eager run's losses on both engines, on gloo ranks.

`pretrain` runs the same tiny config eagerly and with compiled transformer layers (inductor's
C++ backend on the CPU), on 2 ranks:

- pipeline engine, 2 stages, activation checkpointing;
- plain engine (`pipe_parallel_size: 0`), tensor parallelism 2 with sequence parallelism and
  activation checkpointing;
- plain engine, data parallelism 2 under ZeRO stage 3 (DeepSpeed's gather hooks split the
  compiled graphs, still the same losses).

The losses of every step agree within float rounding (1e-5 relative), and the layers really
were compiled: Dynamo captured graphs, and the same run without the key captured none. Dropout
is off: `torch_compile` refuses it (`megatron/config/checks/torch_compile.py`).
"""

from __future__ import annotations

import pytest

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

STEPS = 3
LAYOUTS = {
    "pipeline, 2 stages, checkpointing": dict(pipe_parallel_size=2, checkpoint_activations=True),
    "plain engine, tp 2, sequence parallel, checkpointing": dict(
        pipe_parallel_size=0,
        model_parallel_size=2,
        sequence_parallel=True,
        checkpoint_activations=True,
    ),
    "plain engine, ZeRO 3": dict(pipe_parallel_size=0, zero_optimization={"stage": 3}),
}


def _settings(folder, **changes) -> dict:
    base = dict(
        train_iters=STEPS,
        eval_interval=0,
        do_test=False,
        save=None,
        load=None,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return tiny_settings(folder, **{**base, **changes})


def _train(rank, world_size, runs):
    from torch._dynamo.utils import counters

    from megatron.training import pretrain

    out = []
    for settings in runs:
        before = counters["stats"]["unique_graphs"]
        result = pretrain(resolve(settings, world_size))
        out.append({"losses": result.losses, "graphs": counters["stats"]["unique_graphs"] - before})
    return out


def test_compiled_layers_train_like_eager(tmp_path):
    runs = []
    for layout in LAYOUTS.values():
        for compiled in (False, True):
            folder = tmp_path / f"{len(runs)}"
            runs.append(_settings(folder, torch_compile=compiled, **layout))
    results = run_distributed(_train, 2, runs, timeout=900)
    for rank_results in results:
        for index, name in enumerate(LAYOUTS):
            eager, compiled = rank_results[2 * index], rank_results[2 * index + 1]
            assert eager["graphs"] == 0, name
            assert compiled["graphs"] >= 1, f"{name}: nothing was compiled"
            assert len(compiled["losses"]) == len(eager["losses"]) == STEPS, name
            for step, (c, e) in enumerate(zip(compiled["losses"], eager["losses"])):
                assert abs(c - e) <= 1e-5 * abs(e), f"{name}, step {step}: {c} vs eager {e}"
