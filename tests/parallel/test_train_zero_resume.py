"""`pretrain` on gloo ranks: ZeRO stages (and ZeRO-2 with the optimizer offloaded) agree,
and a run stopped at step 3 and resumed repeats the unbroken run bit for bit (fp32, dropout
on) with tensor, pipeline and data parallelism.

Each test is one `run_distributed` call that trains several tiny runs in the same processes
(start-up is the expensive part).
"""

from __future__ import annotations

import shutil

import pytest

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow


def _pretrain_all(rank, world_size, runs):
    from megatron.training import pretrain

    out = []
    for settings in runs:
        result = pretrain(resolve(settings, world_size))
        valid = result.valid.loss if result.valid else None
        out.append({"losses": result.losses, "valid": valid, "stopped": result.stopped})
    return out


def test_zero_stages_match_zero0_on_the_plain_engine(tmp_path):
    runs = [
        tiny_settings(
            tmp_path / f"zero{stage}",
            pipe_parallel_size=0,
            zero_optimization={"stage": stage},
            checkpoint_factor=None,
            save=None,
            load=None,
        )
        for stage in (0, 1, 2, 3)
    ]
    runs.append(  # optimizer state offloaded to the CPU, DeepSpeed's CPU Adam
        tiny_settings(
            tmp_path / "zero2_offload",
            pipe_parallel_size=0,
            zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}},
            optimizer={"type": "CPU_Adam", "params": {"lr": 2.0e-3, "betas": [0.9, 0.95]}},
            checkpoint_factor=None,
            save=None,
            load=None,
        )
    )
    zero0, *others = run_distributed(_pretrain_all, 2, runs)[0]
    assert len(zero0["losses"]) == 6 and zero0["losses"][-1] < zero0["losses"][0]
    for other in others:
        assert other["losses"] == pytest.approx(zero0["losses"], abs=1e-5)
        assert other["valid"] == pytest.approx(zero0["valid"], abs=1e-5)


def _stop_and_resume(folder, **layout) -> list[dict]:
    """An unbroken run; the same run stopped by exit_interval at 3; its resumption."""
    unbroken = tiny_settings(folder / "unbroken", **layout)
    stopped = tiny_settings(folder / "broken", exit_interval=3, **layout)
    resumed = tiny_settings(folder / "broken", **layout)
    return [unbroken, stopped, resumed]


def _check_resume_is_exact(unbroken, stopped, resumed, layout):
    assert stopped["stopped"] and stopped["losses"] == unbroken["losses"][:3], layout
    assert resumed["losses"] == unbroken["losses"][3:], layout  # bitwise
    assert resumed["valid"] == unbroken["valid"], layout


LAYOUTS_4_RANKS = {
    "pp2_dp2": dict(pipe_parallel_size=2, model_parallel_size=1),
    "tp2_pp2": dict(pipe_parallel_size=2, model_parallel_size=2),
    "tp2_dp2_plain_zero1": dict(
        pipe_parallel_size=0, model_parallel_size=2, zero_optimization={"stage": 1}
    ),
}


def test_resume_is_exact_with_tp_pp_dp_and_pipeline_zero1_matches_zero0(tmp_path):
    runs = []
    for name, layout in LAYOUTS_4_RANKS.items():
        runs += _stop_and_resume(tmp_path / name, **layout)
    runs.append(
        tiny_settings(
            tmp_path / "pp2_dp2_zero1",
            pipe_parallel_size=2,
            zero_optimization={"stage": 1},
            save=None,
            load=None,
        )
    )
    results = run_distributed(_pretrain_all, 4, runs)[0]
    for i, name in enumerate(LAYOUTS_4_RANKS):
        unbroken, stopped, resumed = results[3 * i : 3 * i + 3]
        _check_resume_is_exact(unbroken, stopped, resumed, name)
    pipeline_zero0, pipeline_zero1 = results[0], results[-1]
    assert pipeline_zero1["losses"] == pytest.approx(pipeline_zero0["losses"], abs=1e-5)
    shutil.rmtree(tmp_path, ignore_errors=True)
