"""DeepSpeed's ZeRO-0 fp16/bf16 wrapper (`FP16_UnfusedOptimizer`) steps with one host read,
catches every kind of non-finite gradient, and clips by the true global gradient norm.

The wrapper's step is driven directly on gradients set on the 16-bit weights (as
`test_fp16_engine_scaling.py` does): clean gradients step with one read (counted with
`tests/device_costs.py::HostReads`; DeepSpeed's own step read once per parameter, once for the
agreed flag and twice per group for its norm: 32); a gradient holding inf, -inf or NaN in any
one parameter (the first, a middle, the last) is an overflow, skipped with the scale halved
(hysteresis 1). At tensor-parallel size 2, with every (scaled) gradient element 1e-3, the
reported norm is 1e-3 over the loss scale times the square root of the model's element count
(tensor-parallel shards summed over the ranks, replicated parameters once): DeepSpeed's came
out 0.71 of it.
"""

from __future__ import annotations

import pytest

from tests.device_costs import HostReads
from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings
from tests.unit.training.test_fp16_engine_scaling import _allow_fp16_on_cpu

FP16 = {"loss_scale": 0, "initial_scale_power": 10, "hysteresis": 1, "min_loss_scale": 1}
BAD = (float("inf"), float("-inf"), float("nan"))


def _set_grads(params, bad=None, where=0):
    import torch

    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    if bad is not None:
        params[where].grad.view(-1)[-1] = bad


def _overflow_checks(rank, world_size, folder, precision):
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.engine import build_engine

    _allow_fp16_on_cpu()
    dtype = {"fp16": dict(fp16=FP16), "bf16": dict(precision="bfloat16")}[precision]
    settings = tiny_settings(folder, pipe_parallel_size=0, save=None, load=None, **dtype)
    cfg = resolve(settings, 1)
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    engine = build_engine(cfg, topology, cfg.training.train_iters).engine
    optimizer = engine.optimizer
    params = [p for p in engine.module.parameters() if p.requires_grad]
    _set_grads(params)
    optimizer.step()  # creates Adam's state: its step counters live on the host on any device
    counters = [s["step"] for s in optimizer.state.values()]
    _set_grads(params)
    with HostReads(exempt=counters) as reads:
        clean = optimizer.step()
    out = {"wrapper": type(optimizer).__name__, "params": len(params), "clean": clean,
           "reads": reads.count, "report": reads.report(), "caught": []}  # fmt: skip
    for bad in BAD:
        for where in (0, len(params) // 2, -1):
            scale = optimizer.loss_scale
            _set_grads(params, bad, where)
            overflow = optimizer.step()
            out["caught"].append((overflow, optimizer.loss_scale / scale))
    return out


@pytest.fixture(scope="module", params=["fp16", "bf16"])
def checked(request, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp(request.param))
    return request.param, run_distributed(_overflow_checks, 1, folder, request.param)[0]


def test_the_overflow_check_reads_once_per_step(checked):
    precision, out = checked
    assert out["wrapper"] == "FP16_UnfusedOptimizer" and not out["clean"]
    assert out["params"] > 20  # before: one read per parameter, and more
    assert out["reads"] == 1, f"{precision}: {out['report']}"


def test_every_kind_of_non_finite_gradient_is_still_an_overflow(checked):
    precision, out = checked
    halved = 0.5 if precision == "fp16" else 1.0  # bf16: a static scale of 1
    assert out["caught"] == [(True, halved)] * 9, precision


def _tensor_parallel_norm(rank, world_size, folder):
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel import is_tensor_parallel
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.engine import build_engine

    _allow_fp16_on_cpu()
    settings = tiny_settings(folder, pipe_parallel_size=0, model_parallel_size=2, save=None,
                             load=None, fp16=dict(FP16, initial_scale_power=4))  # fmt: skip
    cfg = resolve(settings, world_size)
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    engine = build_engine(cfg, topology, cfg.training.train_iters).engine
    params = [p for p in engine.module.parameters() if p.requires_grad]
    _set_grads(params)
    scale = engine.optimizer.loss_scale  # the norm is reported unscaled
    engine.optimizer.step()
    sharded = sum(p.numel() for p in params if is_tensor_parallel(p))
    replicated = sum(p.numel() for p in params if not is_tensor_parallel(p))
    return engine.optimizer._global_grad_norm, scale, sharded, replicated


def test_the_norm_counts_every_tensor_parallel_shard_once(tmp_path):
    results = run_distributed(_tensor_parallel_norm, 2, str(tmp_path))
    (norm, scale, _, replicated), (other_norm, _, _, _) = results
    elements = sum(r[2] for r in results) + replicated
    assert norm == other_norm == pytest.approx(1e-3 / scale * elements**0.5, rel=1e-3)
