"""The optimizer step queues a fixed number of GPU kernels, whatever the number of parameters.

On a GPU the step comes right after the step's one host read (the non-finite check), so the
device sits idle while the host queues the step's work: an op per parameter there was some 900
host ops per step at 160M (a copy and a scale of each of ~150 tensors, plus their views),
~4 ms of an H200's 70 ms step in which the plain PyTorch loop's GPU was busy. Counted with
`tests/device_costs.py::HostOps` while the real trainer steps on one rank, at 2 and at 4 layers,
over the end of the backward (where DeepSpeed's wrappers take the gradients) and the step:

- the bf16 plain engine at ZeRO 0 (`FP16_UnfusedOptimizer` under
  `fp16_scaler.UnfusedStepChecks`): the only launches that grow with the layers are the
  gradients' upcast to fp32, one per parameter tensor (fused Adam then takes them all at once);
- bf16 at ZeRO 1 (DeepSpeed's `BF16_Optimizer`, with `bf16_wrapper.py`'s fused accumulation
  and norm): none grow (DeepSpeed's loops: a cast and an add per tensor, and a norm).
"""

from __future__ import annotations

import pytest

from tests.device_costs import HostOps
from tests.distributed import run_distributed
from tests.tiny import resolve, stepping_trainer, tiny_settings

LAYOUTS = {
    "plain_zero0": (dict(pipe_parallel_size=0), "FP16_UnfusedOptimizer", 1),
    "pipeline_zero1": (dict(zero_optimization={"stage": 1}), "BF16_Optimizer", 0),
}


def _step_launches(rank, world_size, folder, layers, layout):
    adamw = {"type": "AdamW", "params": {"lr": 2.0e-3, "fused": True}}  # a GPU's default
    settings = tiny_settings(folder, save=None, load=None, train_iters=4, precision="bfloat16",
                             num_layers=layers, gradient_clipping=1.0, optimizer=adamw,
                             **LAYOUTS[layout][0])  # fmt: skip
    parts, steps, batches = stepping_trainer(resolve(settings, world_size), 4)
    counted, active = HostOps(), []
    for owner, name in ((parts.engine, "_backward_epilogue"), (parts.engine, "_take_model_step"),
                        (parts.engine.optimizer, "update_hp_grads")):  # fmt: skip
        if hasattr(owner, name):  # (the pipeline engine calls the last itself)
            setattr(owner, name, _counting(counted, active, getattr(owner, name)))
    steps.train(batches)
    tensors = sum(1 for p in parts.engine.module.parameters() if p.requires_grad)
    wrapper = type(parts.engine.optimizer).__name__
    return counted.launches, counted.report(), tensors, wrapper


def _counting(counter, active: list, method):
    """`method` counted by `counter` (once when the counted methods nest)."""

    def counted(*args, **kwargs):
        if active:
            return method(*args, **kwargs)
        active.append(True)
        try:
            with counter:
                return method(*args, **kwargs)
        finally:
            active.pop()

    return counted


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_steps_kernels_do_not_grow_with_the_parameters(layout, tmp_path):
    small = run_distributed(_step_launches, 1, str(tmp_path / "2"), 2, layout)[0]
    large = run_distributed(_step_launches, 1, str(tmp_path / "4"), 4, layout)[0]
    assert small[3] == large[3] == LAYOUTS[layout][1]
    more_tensors = large[2] - small[2]
    assert more_tensors > 10  # two layers' weights, biases and norms
    grown = large[0] - small[0]
    per_tensor = LAYOUTS[layout][2]  # ZeRO 0: the fp32 upcast
    assert grown <= per_tensor * more_tensors, (
        f"{grown} more launches for {more_tensors} more tensors: "
        f"2 layers: {small[1]}; 4 layers: {large[1]}"
    )
