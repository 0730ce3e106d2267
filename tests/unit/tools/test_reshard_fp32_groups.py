"""`tools/reshard.py --zero-stage` moves a bf16 run whose Mamba `A_log` and `D` are fp32
parameters in a group of their own (`no_decay_fp32`, `megatron/model/param_groups.py`).

A bf16 run of two Mamba layers trains 4 steps on the pipeline engine at ZeRO 1 (DeepSpeed's
`BF16_Optimizer`); the checkpoint is converted into DeepSpeed's universal layout for the plain
engine at ZeRO 2 (its ZeRO optimizer) and loaded through `CheckpointIO.load`, DeepSpeed's own
`load_universal` path. There, every parameter's fp32 master weight and Adam moments, read with
DeepSpeed's `safe_get_full_*` accessors, equal what DeepSpeed restores from the source at the
source layout; A_log and D are fp32 parameters holding their master values, in the
`no_decay_fp32` group with its own hyperparameters; the resumed run's losses follow the
source layout's resumed losses (bf16 sums in another order: 1e-3).
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

KEYS = ("fp32", "exp_avg", "exp_avg_sq")
RUN = dict(
    hidden_dropout=0.0,
    attention_dropout=0.0,
    eval_interval=1000,
    train_iters=8,
    precision="bfloat16",
    attention_config=[[["mamba"], 2]],
    norm="rmsnorm",
    pos_emb="none",
)
SOURCE = dict(pipe_parallel_size=1, zero_optimization={"stage": 1})
TARGET = dict(pipe_parallel_size=0, zero_optimization={"stage": 2})


def _settings(folder, **changes):
    return tiny_settings(folder, **{**RUN, **changes})


def _engine_state(cfg):
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.checkpoint.checkpoint_io import CheckpointIO
    from megatron.training.setup.engine import build_engine

    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed + 1)  # other initial weights than the saved ones
    engine = build_engine(cfg, topology, cfg.training.train_iters).engine
    assert CheckpointIO(engine, None).load(cfg.checkpointing.load)["iteration"] == 4
    groups = {g["name"]: g["weight_decay"] for g in engine.optimizer.optimizer.param_groups}
    getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", lambda: None)()
    held, kept = {}, {}
    for name, param in engine.module.named_parameters():
        held[name] = {"fp32": safe_get_full_fp32_param(param).cpu()}
        for key in KEYS[1:]:
            held[name][key] = safe_get_full_optimizer_state(param, key).cpu()
        if name.endswith(("A_log", ".D")):
            kept[name] = (str(param.dtype), torch.equal(param.detach(), held[name]["fp32"]))
    return {
        "held": held,
        "groups": groups,
        "kept": kept,
        "wrapper": type(engine.optimizer).__name__,
    }


def _run(rank, world_size, tmp):
    from megatron.training import pretrain
    from tools import reshard as tool

    pretrain(resolve(_settings(tmp / "source", exit_interval=4, **SOURCE), 1))
    ckpt = tmp / "source" / "ckpt"
    reference = resolve(_settings(tmp / "ref", **SOURCE, load=str(ckpt), save=None), 1)
    out = {"source": _engine_state(reference), "reference": pretrain(reference).losses}
    argv = ["--checkpoint", str(ckpt), "--output", str(tmp / "target" / "ckpt")]
    argv += ["--model-parallel-size", "1", "--pipe-parallel-size", "0", "--zero-stage", "2"]
    assert tool.main(argv) == 0
    target = resolve(_settings(tmp / "target", **TARGET, save=None), 1)
    out["target"] = _engine_state(target)
    out["resumed"] = pretrain(target).losses
    # Compared here: tensors do not travel back from a finished worker
    truth = out["source"].pop("held")
    held = out["target"].pop("held")
    out["names"] = sorted(truth) == sorted(held)
    out["differ"] = [
        (name, key)
        for name in held
        for key in KEYS
        if not torch.equal(held[name][key], truth[name][key])
    ]
    return out


def test_a_converted_bf16_run_keeps_a_log_and_d_in_their_fp32_group(tmp_path):
    r = run_distributed(_run, 1, tmp_path, timeout=900)[0]
    source, target = r["source"], r["target"]
    assert (source["wrapper"], target["wrapper"]) == ("BF16_Optimizer", "DeepSpeedZeroOptimizer")
    want = {"decay": 0.01, "no_decay": 0.0, "no_decay_fp32": 0.0}
    assert source["groups"].keys() == target["groups"].keys() == want.keys()
    assert target["groups"]["no_decay_fp32"] == 0.0
    assert r["names"] and r["differ"] == []
    assert len(target["kept"]) == 4
    assert set(target["kept"].values()) == {("torch.float32", True)}
    assert len(r["resumed"]) == len(r["reference"]) == 4
    assert r["resumed"] == pytest.approx(r["reference"], rel=1e-3)
