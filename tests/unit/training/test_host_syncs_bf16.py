"""bf16 steps read what `test_host_syncs.py` counts at fp32, plus DeepSpeed's wrapper's own.

Counted with `tests/device_costs.py::HostReads` while the real trainer steps (one rank):

- the pipeline engine at ZeRO 1 (DeepSpeed's BF16_Optimizer, the main bf16 path): our non-finite
  flag, which carries BF16_Optimizer's test of its gradient norm (`grad_norm.Bf16StepChecks`),
  1 per step. Its clipping test (`if clip_coef < 1`) is gone: the coefficient is clamped on the
  device (before: 3, then 2);
- the plain engine at ZeRO 0 (FP16_UnfusedOptimizer): our flag, which carries the wrapper's
  overflow flag and gradient norm (`fp16_scaler.UnfusedStepChecks`), 1 per step (before: 33,
  one overflow read per parameter, two per parameter group for the norm; then 2).

The on-device clipping multiplies by the same coefficient as DeepSpeed's own, the reference.
"""

from __future__ import annotations

import pytest
import torch

from tests.device_costs import HostReads
from tests.distributed import run_distributed
from tests.tiny import resolve, stepping_trainer, tiny_settings

LAYOUTS = {
    "pipeline_zero1": (dict(pipe_parallel_size=1, zero_optimization={"stage": 1}), 1),
    "plain_zero0": (dict(pipe_parallel_size=0), 1),
}


def _reads_per_step(rank, world_size, folder, layout):
    settings = tiny_settings(folder, save=None, load=None, train_iters=5, precision="bfloat16",
                             **LAYOUTS[layout][0])  # fmt: skip
    parts, steps, batches = stepping_trainer(resolve(settings, world_size), 5)
    state = parts.optimizer.state.values()
    counters = [s["step"] for s in state if torch.is_tensor(s.get("step"))]
    with HostReads(exempt=counters) as reads:
        losses = [steps.train(batches) for _ in range(3)]
    applied = steps.step_applied
    wrapper = type(parts.engine.optimizer).__name__
    return reads.count / 3, reads.report(), [float(loss) for loss in losses], applied, wrapper


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_bf16_step_reads_what_is_listed(layout, tmp_path):
    reads, report, losses, applied, wrapper = run_distributed(
        _reads_per_step, 1, str(tmp_path), layout
    )[0]
    assert wrapper == {"pipeline_zero1": "BF16_Optimizer"}.get(layout, "FP16_UnfusedOptimizer")
    assert reads == LAYOUTS[layout][1], f"{layout}: {reads} reads per step: {report}"
    assert all(0 < loss < 20 for loss in losses) and applied


@pytest.mark.parametrize("max_norm", [0.5, 50.0])  # clips / does not clip
def test_clipping_on_the_device_is_deepspeeds_clipping(max_norm):
    from deepspeed.runtime.utils import clip_tensors_by_global_norm

    from megatron.training.step.grad_norm import clip_tensors_on_device

    g = torch.Generator().manual_seed(0)
    ours = [torch.randn(n, generator=g) for n in (64, 3, 100)]
    theirs = [t.clone() for t in ours]
    norm = torch.linalg.vector_norm(torch.cat(ours))
    with HostReads() as reads:
        clip_tensors_on_device(ours, max_norm=max_norm, global_norm=norm)
    clip_tensors_by_global_norm(theirs, max_norm=max_norm, global_norm=norm)
    assert reads.count == 0
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    clipped = torch.linalg.vector_norm(torch.cat(ours))
    assert clipped == pytest.approx(min(max_norm, float(norm)), rel=1e-5)
