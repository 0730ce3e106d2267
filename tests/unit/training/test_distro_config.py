"""`optimizer: {type: Distro, ...}` resolves with Psyche's names and defaults, builds a Distro,
and the combinations that cannot work are refused at resolution naming the key."""

from __future__ import annotations

import pytest
import torch

from megatron.config.schema import ConfigError
from megatron.training.optim import Distro
from megatron.training.optim.optimizers import build_optimizer_from_config
from tests.tiny import resolve, tiny_settings

PSYCHE = {  # Psyche's `[model.LLM.optimizer.Distro]` section
    "lr": 4.0e-4,
    "clip_grad_norm": 1.0,
    "compression_decay": 0.999,
    "compression_chunk": 64,
    "compression_topk": 8,
    "quantize_1bit": True,
}


def _cfg(tmp_path, params=None, **changes):
    optimizer = {"type": "Distro", "params": dict(params or PSYCHE)}
    return resolve(tiny_settings(tmp_path, optimizer=optimizer, **changes), world_size=2)


def test_psyche_section_builds_distro_with_its_settings(tmp_path):
    cfg = _cfg(tmp_path, gradient_clipping=1.0, weight_decay=0.1)
    assert cfg.optimizer.optimizer_type == "Distro" and cfg.optimizer.lr == 4.0e-4
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer, groups = build_optimizer_from_config(cfg, model)
    assert isinstance(optimizer, Distro)
    assert (optimizer.decay, optimizer.chunk, optimizer.topk) == (0.999, 64, 8)
    assert optimizer.quantize_1bit is True
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


@pytest.mark.parametrize(
    ("changes", "params", "message"),
    [
        ({"zero_optimization": {"stage": 1}}, None, "ZeRO stage 1"),
        ({"fp16": {"enabled": True}}, None, "precision fp16.*precision: fp32"),
        ({"bf16": {"enabled": True}, "pipe_parallel_size": 0}, None, "precision bf16"),
        ({}, {**PSYCHE, "betas": [0.9, 0.95]}, r"\['betas'\] are not Distro parameters"),
        ({"moe_num_experts": 2}, None, "moe_num_experts 2.*moe_num_experts: 1"),
        ({"gradient_clipping": 0.5}, None, "clip_grad_norm.*is 1.0 but gradient_clipping"),
        ({"weight_decay": 0.1}, {**PSYCHE, "weight_decay": 0.0}, "weight_decay"),
    ],
)
def test_combinations_that_cannot_work_are_refused(tmp_path, changes, params, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(tmp_path, params, **changes)
