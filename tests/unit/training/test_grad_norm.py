"""The global gradient norm: each gradient counted once, clipping to the maximum."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron.training.step.grad_norm import clip_by_global_norm, global_grad_norm

ONE_RANK = SimpleNamespace(tp_rank=0, tp_group=None, pp_group=None)


def _params(*grads):
    params = []
    for grad in grads:
        p = torch.nn.Parameter(torch.zeros(len(grad)))
        p.grad = torch.tensor(grad)
        params.append(p)
    return params


def test_norm_and_clipping_match_torch():
    ours = _params([3.0, 4.0], [12.0])
    ref = _params([3.0, 4.0], [12.0])
    norm = clip_by_global_norm(ours, 1.3, ONE_RANK)
    expected = torch.nn.utils.clip_grad_norm_(ref, 1.3)
    assert norm.item() == pytest.approx(13.0) == expected.item()
    for a, b in zip(ours, ref):
        assert torch.allclose(a.grad, b.grad)
    small = _params([0.3, 0.4])
    clip_by_global_norm(small, 1.0, ONE_RANK)
    assert small[0].grad.tolist() == pytest.approx([0.3, 0.4])  # below the maximum: untouched


def test_tied_copies_and_replicas_on_other_tp_ranks_are_not_counted():
    tied, shard, replicated = _params([3.0], [4.0], [100.0])
    tied.ds_pipe_replicated = True
    shard.tensor_model_parallel = True
    assert global_grad_norm([tied, shard, replicated], ONE_RANK).item() == pytest.approx(
        (16 + 100**2) ** 0.5
    )
    other_tp_rank = SimpleNamespace(tp_rank=1, tp_group=None, pp_group=None)
    assert global_grad_norm([tied, shard, replicated], other_tp_rank).item() == 4.0
