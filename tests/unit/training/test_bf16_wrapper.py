"""`bf16_wrapper.py` computes what DeepSpeed 0.19.8's `BF16_Optimizer` computes, in one fused op.

- The fused gradient accumulation leaves the fp32 accumulators, `_hp_grad` links, the
  "has gradients" marks and the cleared bf16 gradients exactly as DeepSpeed's own loop
  (`BF16_Optimizer.update_hp_grads`, run on a twin of the same state).
- `foreach_global_norm` is DeepSpeed's `get_global_norm_of_tensors` (within fp32 rounding: the
  per-tensor sums run in another order), -1 where a gradient is not finite, as DeepSpeed masks.
"""

from __future__ import annotations

import math

import pytest
import torch
from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
from deepspeed.runtime.utils import get_global_norm_of_tensors

from megatron.training.step.bf16_wrapper import foreach_global_norm, fuse_hp_grad_updates

SHAPES = [[(4, 3), (5,), (2, 2, 2)], [(7,), (1, 6)]]  # two parameter groups


def wrapper_state(seed: int) -> BF16_Optimizer:
    """A `BF16_Optimizer` holding only what gradient accumulation reads: bf16 parameters with
    gradients (one without), fp32 accumulators already holding a micro-batch's sum."""
    gen = torch.Generator().manual_seed(seed)
    opt = object.__new__(BF16_Optimizer)
    opt.immediate_grad_update, opt.autoep_folding_tp_group = False, None
    opt.bf16_groups, opt.fp32_groups_gradients, opt.fp32_groups_has_gradients = [], [], []
    for shapes in SHAPES:
        params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.bfloat16)) for s in shapes]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
        params[1].grad = None if len(params) > 2 else params[1].grad
        opt.bf16_groups.append(params)
        opt.fp32_groups_gradients.append([torch.randn(s, generator=gen) for s in shapes])
        opt.fp32_groups_has_gradients.append([False] * len(shapes))
    return opt


@pytest.mark.parametrize("clear", [False, True])
def test_fused_accumulation_is_deepspeeds(clear):
    ours, theirs = wrapper_state(0), wrapper_state(0)
    fuse_hp_grad_updates(ours)
    ours.update_hp_grads(clear_lp_grads=clear)
    BF16_Optimizer.update_hp_grads(theirs, clear_lp_grads=clear)
    assert ours.fp32_groups_has_gradients == theirs.fp32_groups_has_gradients
    assert ours.fp32_groups_has_gradients[0] == [True, False, True]
    for i, group in enumerate(theirs.bf16_groups):
        for j, lp in enumerate(group):
            assert torch.equal(ours.fp32_groups_gradients[i][j], theirs.fp32_groups_gradients[i][j])
            mine = ours.bf16_groups[i][j]
            assert (mine.grad is None) == (lp.grad is None)
            if lp.grad is not None:
                assert torch.equal(mine.grad, lp.grad)
                assert mine._hp_grad is ours.fp32_groups_gradients[i][j]


def test_accumulating_in_hooks_keeps_deepspeeds_loop():
    opt = wrapper_state(1)
    opt.immediate_grad_update = True  # DeepSpeed's loop returns at once
    before = [t.clone() for group in opt.fp32_groups_gradients for t in group]
    fuse_hp_grad_updates(opt)
    opt.update_hp_grads()
    after = [t for group in opt.fp32_groups_gradients for t in group]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0])
def test_foreach_norm_is_deepspeeds(norm_type):
    gen = torch.Generator().manual_seed(2)
    grads = [torch.randn(s, generator=gen) * 10 for s in ((300, 7), (5,), (64, 64))]
    ours = foreach_global_norm(grads, norm_type=norm_type)
    theirs = get_global_norm_of_tensors(grads, norm_type=norm_type)
    assert ours.dtype == theirs.dtype == torch.float32
    assert math.isclose(float(ours), float(theirs), rel_tol=1e-6)
    flat = torch.cat([g.flatten().double() for g in grads])
    assert math.isclose(float(ours), float(flat.abs().pow(norm_type).sum() ** (1 / norm_type)),
                        rel_tol=1e-6)  # fmt: skip


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_nonfinite_gradient_masks_the_norm_as_deepspeed_does(bad):
    grads = [torch.ones(3), torch.tensor([1.0, bad])]
    assert float(foreach_global_norm(grads)) == float(get_global_norm_of_tensors(grads)) == -1.0
