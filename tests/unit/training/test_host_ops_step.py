"""The optimizer step queues a fixed number of GPU kernels, whatever the number of parameters.

On a GPU the step comes right after the step's one host read (the non-finite check), so the
device sits idle while the host queues the step's work: an op per parameter there was some 900
kernel launches per step at 160M (a copy and a scale of each of ~150 tensors, plus their views),
~5 ms of an H200's 70 ms step in which the plain PyTorch loop's GPU was busy. Counted with
`tests/device_costs.py::HostOps` while the real trainer steps on one rank: the bf16 plain engine
at ZeRO 0 (`FP16_UnfusedOptimizer` under `fp16_scaler.UnfusedStepChecks`), at 2 and at 4
layers. The only launches that grow with the layers are the gradients' upcast to fp32, one per
parameter tensor (what the fp32 master weights' optimizer needs; fused Adam then takes them all
at once).
"""

from __future__ import annotations

from tests.device_costs import HostOps
from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings


def _step_launches(rank, world_size, folder, layers):
    from megatron.data import build_tokenizer
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.batches import BatchSettings
    from megatron.training.setup.data import BatchFactory, build_datasets
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.nonfinite import NonFiniteSteps
    from megatron.training.step.steps import engine_steps

    adamw = {"type": "AdamW", "params": {"lr": 2.0e-3, "fused": True}}  # a GPU's default
    settings = tiny_settings(folder, save=None, load=None, train_iters=4, precision="bfloat16",
                             pipe_parallel_size=0, num_layers=layers, gradient_clipping=1.0,
                             optimizer=adamw)  # fmt: skip
    cfg = resolve(settings, world_size)
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    parts = build_engine(cfg, topology, 4)
    steps = engine_steps(parts.engine, topology)
    NonFiniteSteps(parts.engine, parts.optimizer, topology, steps.local_loss).install()
    batch = BatchSettings.from_config(cfg, build_tokenizer(cfg).eod)
    batches = BatchFactory(cfg, topology, batch, parts.engine.device)
    batches = batches(build_datasets(cfg, 4)[0], 0)
    steps.train(batches)  # the first step creates the optimizer's state
    take_step, counted = parts.engine._take_model_step, HostOps()

    def counted_step(*args, **kwargs):
        with counted:
            return take_step(*args, **kwargs)

    parts.engine._take_model_step = counted_step
    steps.train(batches)
    tensors = sum(1 for p in parts.engine.module.parameters() if p.requires_grad)
    wrapper = type(parts.engine.optimizer).__name__
    return counted.launches, counted.report(), tensors, wrapper


def test_the_steps_kernels_do_not_grow_with_the_parameters(tmp_path):
    small = run_distributed(_step_launches, 1, str(tmp_path / "2"), 2)[0]
    large = run_distributed(_step_launches, 1, str(tmp_path / "4"), 4)[0]
    assert small[3] == large[3] == "FP16_UnfusedOptimizer"
    more_tensors = large[2] - small[2]
    assert more_tensors > 10  # two layers' weights, biases and norms
    grown = large[0] - small[0]
    # one upcast per added parameter tensor; before: ~6 per tensor (copy back, scale, views)
    assert grown <= more_tensors, f"{grown} more launches for {more_tensors} more tensors: " + (
        f"2 layers: {small[1]}; 4 layers: {large[1]}"
    )
