"""Which machine a plan is for: the named GPU, a given memory, this machine's GPU or its CPU."""

from __future__ import annotations

import pytest

from megatron.config import ConfigError
from megatron.planning.machine import GIB, machine_of
from tests.tiny import tiny_config


def test_a_named_gpu_gives_its_memory_peak_and_nvlink():
    m = machine_of(tiny_config(plan_gpu="a100-40gb", precision="bfloat16"))
    assert (m.device, m.name, m.peak_tflops) == ("cuda", "A100-40GB", 312.0)
    assert m.memory == int(39.4 * GIB) and m.links.nvlink == 300.0
    assert m.links.network == 25.0 and m.links.gpus_per_node == 8


def test_keys_override_the_table():
    cfg = tiny_config(plan_gpu="H100", gpu_memory_gib=64, plan_nvlink_gb_per_s=200,
                      plan_gpus_per_node=4, peak_theoretical_tflops=500)  # fmt: skip
    m = machine_of(cfg)
    assert (m.memory, m.links.nvlink, m.links.gpus_per_node, m.peak_tflops) == (
        64 * GIB, 200.0, 4, 500.0)  # fmt: skip
    other = machine_of(tiny_config(gpu_memory_gib=24, peak_theoretical_tflops=100))
    assert (other.device, other.memory, other.peak_tflops) == ("cuda", 24 * GIB, 100.0)


def test_without_a_gpu_the_plan_is_for_this_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    m = machine_of(tiny_config())
    assert m.device == "cpu" and m.peak_tflops is None and m.memory > 0


def test_an_unknown_gpu_is_refused_with_the_names():
    with pytest.raises(ConfigError, match="did you mean 'H100'"):
        machine_of(tiny_config(plan_gpu="H10O"))


@pytest.mark.parametrize("key,value", [("gpu_memory_gib", 0), ("plan_mfu", 1.5),
                                       ("plan_network_gb_per_s", -1)])  # fmt: skip
def test_bad_figures_are_refused_at_resolution(key, value):
    with pytest.raises(ConfigError, match=key):
        tiny_config(**{key: value})
