"""Expert parallelism through `deepy.py`: 2 CPU ranks, `moe_expert_parallel_size: 2`.

A run of 8 iterations (pipeline engine, 4 experts split 2 + 2, dropout and gradient clipping
on) saves at 4 and 8; each checkpoint holds expert-parallel rank 1's experts once, in
`expert_states_pp0_ep1.pt`. A second run resumed from a copy of the step-4 checkpoint repeats
iterations 5-8 bit for bit, so both ranks got their own experts and optimizer moments back.
`tools/reshard.py` moving that checkpoint to ep 1 and back to ep 2 writes the files training
saved: every layer file, the optimizer state of the `mp_rank` files and the expert file, tensor
for tensor (issue 13: the offline writer is training's format at any ep).
The router losses are logged. The multi-process parity of the layer and the reduction is
`tests/parallel/test_moe_parallel.py`; this checks that the product wires them together.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from megatron.checkpoint.folders import write_latest
from megatron.checkpoint_tools import CheckpointReader
from tests.e2e.test_train_deepy import _deepy, _finish, _records, _train_losses, _write_config

MOE = dict(
    num_gpus=2,
    moe_num_experts=4,
    moe_top_k=2,
    moe_router_type="topk",
    moe_expert_interval=1,
    moe_aux_loss_coeff=0.01,
    moe_z_loss_coeff=0.001,
    moe_expert_parallel_size=2,
    gradient_clipping=1.0,
    train_iters=8,
    checkpoint_factor=4,
    eval_interval=4,
)


def test_expert_parallel_run_saves_each_expert_once_and_resumes_exactly(tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    out = _finish(_deepy(_write_config(whole, **MOE)))
    losses = _train_losses(whole)
    assert sorted(losses) == list(range(1, 9)), out[-3000:]
    assert all("moe_aux_loss" in r for r in _records(whole) if "split" not in r)
    step4 = whole / "ckpt" / "global_step4"
    assert sorted(p.name for p in step4.glob("expert_states_*")) == ["expert_states_pp0_ep1.pt"]

    _reshard_round_trip_writes_the_saved_files(step4, tmp_path)

    shutil.copytree(step4, resumed / "ckpt" / "global_step4")
    write_latest(resumed / "ckpt", "global_step4")
    out = _finish(_deepy(_write_config(resumed, **MOE)))
    again = _train_losses(resumed)
    assert sorted(again) == [5, 6, 7, 8], out[-3000:]
    assert again == {it: losses[it] for it in again}  # bitwise: JSON floats round-trip


WEIGHT_FILES = ("layer_", "expert_states_")


def _same(a, b, where: str) -> None:
    assert isinstance(b, dict) if isinstance(a, dict) else type(a) is type(b), where
    if torch.is_tensor(a):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert sorted(a, key=str) == sorted(b, key=str), where
        for key in a:
            _same(a[key], b[key], f"{where}/{key}")
    else:
        assert a == b, where


def _reshard_round_trip_writes_the_saved_files(step: Path, tmp_path: Path) -> None:
    from tools import reshard

    layout = CheckpointReader(step).layout
    there = ["--model-parallel-size", str(layout.tp), "--pipe-parallel-size", str(layout.pp)]
    for src, dst, ep in ((step, tmp_path / "ep1", "1"), (tmp_path / "ep1", tmp_path / "ep2", "2")):
        argv = ["--checkpoint", str(src), "--output", str(dst), *there]
        assert reshard.main([*argv, "--expert-parallel-size", ep]) == 0
    back = tmp_path / "ep2" / step.name
    assert not list((tmp_path / "ep1" / step.name).glob("expert_states_*"))
    names = sorted(p.name for p in step.glob("*.pt") if p.name.startswith(WEIGHT_FILES))
    assert names == sorted(p.name for p in back.glob("*.pt") if p.name.startswith(WEIGHT_FILES))
    for name in names:
        _same(torch.load(step / name), torch.load(back / name), name)
    for saved in step.glob("mp_rank_*_model_states.pt"):
        ours = torch.load(back / saved.name)["optimizer"]["state"]
        _same(torch.load(saved)["optimizer"]["state"], ours, saved.name)
