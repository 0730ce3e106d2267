"""AdamW takes torch's fused kernel on a CUDA accelerator, wherever the parameters are when it
is built: the plain engine builds the optimizer before DeepSpeed moves the model to the GPU,
so deciding from the parameters (still on the CPU there) never fused it.

The accelerator is faked (torch's fused AdamW also runs on the CPU, so the optimizer builds).
"""

from __future__ import annotations

import deepspeed.accelerator
import pytest
import torch

from megatron.training.optim.optimizers import build_optimizer


class _Accelerator:
    def __init__(self, name):
        self.name = name

    def device_name(self, device_index=None):
        return self.name


def _adamw(monkeypatch, accelerator, **params):
    monkeypatch.setattr(deepspeed.accelerator, "get_accelerator", lambda: _Accelerator(accelerator))
    groups = [{"params": [torch.nn.Parameter(torch.ones(4, 4))]}]  # on the CPU, as built
    return build_optimizer(groups, "AdamW", 1e-3, 0.1, params)


@pytest.mark.parametrize("accelerator,fused", [("cuda", True), ("cpu", False)])
def test_adamw_fuses_on_a_cuda_accelerator_with_parameters_still_on_the_cpu(
    monkeypatch, accelerator, fused
):
    assert _adamw(monkeypatch, accelerator).defaults["fused"] is fused


def test_optimizer_params_fused_overrides(monkeypatch):
    assert _adamw(monkeypatch, "cuda", fused=False).defaults["fused"] is False


def test_fused_adamw_steps_as_the_reference_adamw(monkeypatch):
    """The fused kernel gives torch's unfused AdamW's update (within float rounding)."""
    fused = _adamw(monkeypatch, "cuda")
    (p,) = fused.param_groups[0]["params"]
    q = torch.nn.Parameter(p.detach().clone())
    reference = torch.optim.AdamW([q], lr=1e-3, weight_decay=0.1, foreach=False)
    for step in range(3):
        p.grad = torch.randn(4, 4, generator=torch.Generator().manual_seed(step))
        q.grad = p.grad.clone()
        fused.step(), reference.step()
    torch.testing.assert_close(p, q)
