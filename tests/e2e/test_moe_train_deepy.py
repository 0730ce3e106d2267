"""Expert parallelism through `deepy.py`: 2 CPU ranks, `moe_expert_parallel_size: 2`.

A run of 8 iterations (pipeline engine, 4 experts split 2 + 2, dropout and gradient clipping
on) saves at 4 and 8; each checkpoint holds expert-parallel rank 1's experts once, in
`expert_states_pp0_ep1.pt`. A second run resumed from a copy of the step-4 checkpoint repeats
iterations 5-8 bit for bit, so both ranks got their own experts and optimizer moments back.
The router losses are logged. The multi-process parity of the layer and the reduction is
`tests/parallel/test_moe_parallel.py`; this checks that the product wires them together.
"""

from __future__ import annotations

import shutil

from megatron.training.checkpointing import write_latest
from tests.e2e.test_train_deepy import _deepy, _finish, _records, _train_losses, _write_config

MOE = dict(
    num_gpus=2,
    moe_num_experts=4,
    moe_top_k=2,
    moe_router_type="topk",
    expert_interval=1,
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

    shutil.copytree(step4, resumed / "ckpt" / "global_step4")
    write_latest(resumed / "ckpt", "global_step4")
    out = _finish(_deepy(_write_config(resumed, **MOE)))
    again = _train_losses(resumed)
    assert sorted(again) == [5, 6, 7, 8], out[-3000:]
    assert again == {it: losses[it] for it in again}  # bitwise: JSON floats round-trip
