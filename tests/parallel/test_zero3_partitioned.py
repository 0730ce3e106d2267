"""ZeRO-3 builds the model partitioned (`model_setup.build_model_for_engine`, called by
`engine_setup.build_engine`): right after construction each of 2 gloo ranks holds about half
of every parameter, the gathered values are those of the model built without ZeRO-3 (fp32,
and bf16 as the engine casts it), and training losses equal ZeRO 0 even when every parameter,
the tied embedding included, is released between uses (`stage3_param_persistence_threshold`
0), with the full logits and with the fused head and loss."""

from __future__ import annotations

import shutil

import pytest

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

ZERO3 = {"stage": 3, "stage3_param_persistence_threshold": 0}


def _plain(folder, **changes) -> dict:
    return tiny_settings(
        folder, pipe_parallel_size=0, checkpoint_factor=None, save=None, load=None, **changes
    )


def _storage_bytes(t) -> int:
    return t.untyped_storage().nbytes() if t.numel() else 0


def _built_partitioned(rank, world_size, folder, precision):
    import torch
    from deepspeed.runtime.zero.partition_parameters import GatheredParameters

    from megatron.config import deepspeed_config
    from megatron.launcher.worker import initialize_distributed
    from megatron.model import build_model
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.model import build_model_for_engine

    extra = {"bf16": {"enabled": True}} if precision == "bf16" else {}
    cfg = resolve(_plain(folder, zero_optimization=ZERO3, **extra), world_size)
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    model = build_model_for_engine(cfg, topology, deepspeed_config(cfg))
    params = list(model.named_parameters())
    resident = sum(_storage_bytes(p.data) + _storage_bytes(p.ds_tensor) for _, p in params)
    full = sum(p.ds_numel * p.ds_tensor.element_size() for _, p in params)
    dtypes = {str(p.ds_tensor.dtype) for _, p in params}
    seed_everything(cfg.training.seed)
    reference = dict(build_model(cfg, topology).named_parameters())  # as without ZeRO-3
    same = []
    with GatheredParameters([p for _, p in params]):
        for name, p in params:
            expected = reference[name].detach().to(p.dtype)
            same.append(bool(torch.equal(p.detach(), expected)))
    return {"resident": resident, "full": full, "dtypes": dtypes, "same": all(same)}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_zero3_model_is_built_partitioned_with_the_same_values(tmp_path, precision):
    results = run_distributed(_built_partitioned, 2, tmp_path, precision)
    for r in results:
        assert r["same"], "gathered ZeRO-3 parameters differ from the model built without it"
        assert r["dtypes"] == {"torch.float32" if precision == "fp32" else "torch.bfloat16"}
        # each rank holds half of every parameter (plus at most one element of padding each)
        assert r["resident"] <= 0.5 * r["full"] * 1.01 + 1024, r
        assert r["resident"] >= 0.5 * r["full"] * 0.99, r


def _losses(rank, world_size, runs):
    from megatron.training import pretrain

    return [pretrain(resolve(settings, world_size)).losses for settings in runs]


def test_zero3_partitioned_losses_equal_zero0(tmp_path):
    """Also with the fused head and loss (`loss_chunk_tokens`), whose loss runs after the
    model's forward, where ZeRO-3 has partitioned the head's weight again (the tied table's
    after the embedding's forward, the untied head's after the head's): the loss gathers it
    (`megatron/model/head.py::head_weight`), and the losses equal the unfused ZeRO-0 run's,
    tied and untied."""
    unfused = dict(loss_chunk_tokens=0)
    fused = dict(loss_chunk_tokens=16)  # 4 chunks of a 64-token micro-batch
    runs = [
        _plain(tmp_path / "zero0", zero_optimization={"stage": 0}, **unfused),
        _plain(tmp_path / "zero3", zero_optimization=ZERO3, **unfused),
        _plain(tmp_path / "zero3_fused", zero_optimization=ZERO3, **fused),
        _plain(tmp_path / "zero0_untied", no_weight_tying=True, **unfused),
        _plain(tmp_path / "zero3_untied", zero_optimization=ZERO3, no_weight_tying=True, **fused),
    ]
    zero0, zero3, zero3_fused, zero0_untied, zero3_untied = run_distributed(_losses, 2, runs)[0]
    assert len(zero0) == 6
    assert zero3 == pytest.approx(zero0, abs=1e-5)
    assert zero3_fused == pytest.approx(zero0, abs=1e-5)
    assert zero3_untied == pytest.approx(zero0_untied, abs=1e-5)
    assert zero0_untied != pytest.approx(zero0, abs=1e-3)  # the untied runs are another model
    shutil.rmtree(tmp_path, ignore_errors=True)
