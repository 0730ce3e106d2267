"""Two data-parallel ranks on one GPU, over a process group whose only backend is for CUDA
tensors (`cuda:gloo`; NCCL refuses two ranks on one device). A collective on a host tensor is
refused there, as NCCL refuses it, which a CPU run over plain gloo cannot show: these runs
catch a collective the trainer makes on a CPU tensor. dp 2 on the plain engine, DPO at dp 2
(its reference model beside the policy), MoE at dp 2; each trains 3 steps, finite and alike
on both ranks. GPU only (`bench/gpu_check.py` runs it with `pytest -m gpu`)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.distributed import run_distributed
from tests.parallel.test_post_training_resume import write_datasets
from tests.tiny import resolve, tiny_settings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
MOE = dict(moe_num_experts=4, moe_top_k=2, moe_router_type="topk", moe_aux_loss_coeff=0.01,
           moe_token_dropping=False)  # fmt: skip


def _pretrain_all(rank, world_size, runs):
    from megatron.training import pretrain

    assert not torch.distributed.get_backend().startswith("nccl")
    return [pretrain(resolve(settings, world_size)).losses for settings in runs]


def test_dp2_plain_dpo_and_moe_on_one_gpu(tmp_path):
    base = dict(pipe_parallel_size=0, train_iters=3, eval_interval=0, do_test=False, save=None,
                load=None, precision="fp32", zero_optimization={"stage": 0})  # fmt: skip
    dpo = dict(write_datasets(tmp_path)["dpo"], data_path=None)
    runs = [
        tiny_settings(tmp_path / "plain", **base),
        tiny_settings(tmp_path / "dpo", **base, **dpo),
        tiny_settings(tmp_path / "moe", **base, **MOE),
    ]
    ranks = run_distributed(_pretrain_all, 2, runs, timeout=600, backend="cuda:gloo")
    for name, losses, other in zip(("plain", "dpo", "moe"), ranks[0], ranks[1], strict=True):
        assert len(losses) == 3 and all(math.isfinite(x) for x in losses), (name, losses)
        assert losses == other, name  # the loss is averaged over data parallel
