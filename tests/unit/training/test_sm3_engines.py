"""SM3 keeps its definition under every engine the trainer allows, and is refused elsewhere.

1. Which DeepSpeed wrappers flatten the parameters, asked of DeepSpeed itself: a real SM3
   handed to `deepspeed.initialize` for every precision × engine × ZeRO stage steps over
   tensors shaped like the parameters exactly where `flattening_wrapper` says it does.
2. Every allowed combination, built by `build_engine` and trained for real steps: SM3 steps
   over tensors shaped like the model's parameters, keeps a row and a column accumulator per
   matrix, and each step equals the SM3-II update of Anil et al. (2019), written below.
3. The flattening combinations are refused at resolution, naming the optimizer and what to
   do; `build_engine`'s own check stops a flattened SM3 that got past resolution.

DeepSpeed refuses fp16 on a CPU without native fp16 kernels (a capability check; torch
computes fp16 on any CPU): the workers answer it with "supported".
"""

from __future__ import annotations

import pytest
import torch

from megatron.config.schema import ConfigError
from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

SM3 = {"type": "SM3", "params": {"lr": 0.05}}
FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8}
PRECISIONS = {"fp32": {}, "bf16": {"bf16": {"enabled": True}}, "fp16": {"fp16": FP16}}
ALLOWED = [("fp32", 0), ("fp32", 1), ("bf16", 0), ("fp16", 0), ("fp16", 1)]  # (precision, pp)


def _settings(folder, precision, pp, zero=0, **changes):
    return tiny_settings(folder, pipe_parallel_size=pp, zero_optimization={"stage": zero},
                         hidden_dropout=0.0, attention_dropout=0.0, weight_decay=0.0,
                         save=None, load=None, checkpoint_factor=None, eval_interval=0,
                         **PRECISIONS[precision], **changes)  # fmt: skip


def sm3_reference(p, g, accs, lr):
    """SM3-II: nu = min over the covers holding each entry (rows, columns) + g²;
    p -= lr g / sqrt(nu); each cover's accumulator becomes the max of nu over it.
    A vector is covered entry by entry (Adagrad). Returns (new p, new accumulators)."""
    if p.dim() == 2:
        rows, cols = accs[0].reshape(-1), accs[1].reshape(-1)
        nu = torch.minimum(rows[:, None], cols[None, :]) + g * g
        new = [nu.max(dim=1).values, nu.max(dim=0).values]
    else:
        nu = accs[0] + g * g
        new = [nu]
    return p - lr * g / nu.sqrt(), new


def _allow_fp16_on_cpu():
    from deepspeed.accelerator import get_accelerator

    type(get_accelerator()).is_fp16_supported = lambda self: True


def _shapes_kept_by_deepspeed(rank, world_size, folder, combos):
    """For each (precision, pp, zero): does a real SM3 inside DeepSpeed's wrapper step over
    tensors shaped like the parameters?"""
    import deepspeed

    from megatron.config import deepspeed_config
    from megatron.config.checks.optimizer_engines import flattening_wrapper
    from megatron.launcher.worker import initialize_distributed
    from megatron.model import build_model
    from megatron.model.param_groups import param_groups
    from megatron.training.optim.optimizers import build_optimizer, check_parameter_shapes

    _allow_fp16_on_cpu()
    out = []
    for precision, pp, zero in combos:
        # resolved with Adam (SM3 is refused in some of these); the engine gets a real SM3
        cfg = resolve(_settings(folder, precision, pp, zero), world_size)
        topology = initialize_distributed(cfg)
        model = build_model(cfg, topology)
        sm3 = build_optimizer(param_groups(model, 0.0), "SM3", 0.05)
        ds = {**deepspeed_config(cfg), "zero_allow_untested_optimizer": True}
        deepspeed.initialize(model=model, optimizer=sm3, config=ds,
                             mpu=None if pp else topology)  # fmt: skip
        stepped = sorted(tuple(p.shape) for g in sm3.param_groups for p in g["params"])
        params = sorted(tuple(getattr(p, "ds_shape", p.shape)) for p in model.parameters())
        try:
            check_parameter_shapes("SM3", sm3, model)  # build_engine's check after initialize
            checked = True
        except RuntimeError:
            checked = False
        out.append((stepped == params, flattening_wrapper(cfg) is None, checked))
    return out


@pytest.mark.slow
def test_deepspeed_flattens_exactly_where_we_refuse(tmp_path):
    combos = [(precision, pp, zero) for precision in PRECISIONS for pp in (0, 1) for zero in (0, 1)]
    combos += [("fp32", 0, 2), ("fp32", 0, 3), ("bf16", 0, 3)]
    results = run_distributed(_shapes_kept_by_deepspeed, 1, tmp_path, combos, timeout=900)[0]
    for combo, (kept, predicted, checked) in zip(combos, results):
        assert kept == predicted == checked, combo
    assert sum(kept for kept, *_ in results) == len(ALLOWED)


def _record_steps(optimizer, log):
    """Optimizer step hooks logging what each SM3 step saw and did."""

    def before(opt, args, kwargs):
        log.append({"before": [], "after": []})
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    accs = opt.state[p].get("accumulators")
                    log[-1]["before"].append((p.detach().clone(), p.grad.detach().clone(),
                                              None if accs is None else [a.clone() for a in accs],
                                              group["lr"]))  # fmt: skip

    def after(opt, args, kwargs):
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    accs = [a.clone() for a in opt.state[p]["accumulators"]]
                    log[-1]["after"].append((p.detach().clone(), accs))

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(after)


def _sm3_in_allowed_engines(rank, world_size, folder):
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.steps import engine_steps

    _allow_fp16_on_cpu()
    g = torch.Generator().manual_seed(0)
    tokens, labels = torch.randint(0, 500, (2, 2, 32), generator=g)
    batch = ((tokens, torch.arange(32).expand(2, 32)), (labels, torch.ones(2, 32)))
    out = {}
    for precision, pp in ALLOWED:
        cfg = resolve(_settings(folder, precision, pp, optimizer=SM3), world_size)
        topology = initialize_distributed(cfg)
        seed_everything(cfg.training.seed)
        parts = build_engine(cfg, topology, cfg.training.train_iters)
        log = []
        _record_steps(parts.optimizer, log)
        steps = engine_steps(parts.engine, topology)
        for _ in range(3):
            steps.train_step(iter([batch] * 2))
        shapes = sorted(tuple(p.shape) for p in parts.model.parameters())
        out[(precision, pp)] = (len(log), _problems(log, shapes))
    return out


def _initial_accumulators(p):
    if p.dim() == 2:
        return [torch.zeros(p.shape[0], 1), torch.zeros(1, p.shape[1])]
    return [torch.zeros_like(p)]


def _problems(log, param_shapes) -> list[str]:
    """What differs between the logged SM3 steps and SM3-II on tensors shaped like the
    parameters (checked in the worker: tensors do not travel back)."""
    problems = []
    for i, step in enumerate(log):
        if not step["before"] or len(step["before"]) != len(step["after"]):
            problems.append(f"step {i}: no parameter stepped, or not all of them")
        if sorted(tuple(p.shape) for p, *_ in step["before"]) != param_shapes:
            problems.append(f"step {i}: SM3 stepped over tensors not shaped like the parameters")
        for (p, g, accs, lr), (p_after, accs_after) in zip(step["before"], step["after"]):
            if p.dtype != torch.float32:  # fp32 weights or the wrapper's fp32 master copies
                problems.append(f"step {i}: SM3 stepped over {p.dtype} tensors")
            accs = accs if accs is not None else _initial_accumulators(p)
            expected_p, expected_accs = sm3_reference(p, g, accs, lr)
            shapes = [tuple(a.shape) for a in accs_after]
            if shapes != [tuple(a.shape) for a in _initial_accumulators(p)]:
                problems.append(f"step {i}: accumulators {shapes} for a parameter {p.shape}")
            for a, e in zip(accs_after, expected_accs):
                if not torch.allclose(a.reshape(-1), e.reshape(-1), rtol=1e-6, atol=0):
                    problems.append(f"step {i}: accumulator of {tuple(p.shape)} is not SM3-II's")
            if not torch.allclose(p_after, expected_p, rtol=1e-5, atol=1e-7):
                problems.append(f"step {i}: update of {tuple(p.shape)} is not SM3-II's")
    return problems


@pytest.mark.slow
def test_sm3_steps_are_sm3_ii_in_every_allowed_engine(tmp_path):
    results = run_distributed(_sm3_in_allowed_engines, 1, tmp_path, timeout=900)[0]
    assert set(results) == set(ALLOWED)
    for combo, (steps, problems) in results.items():
        assert steps >= 2, combo  # fp16 may skip an overflowing step, never all of them
        assert problems == [], (combo, problems[:5])


@pytest.mark.parametrize(
    "changes, combination",
    [
        (dict(zero_optimization={"stage": 1}), "ZeRO stage 1"),
        (dict(zero_optimization={"stage": 2}, pipe_parallel_size=0), "ZeRO stage 2"),
        (dict(zero_optimization={"stage": 3}, pipe_parallel_size=0), "ZeRO stage 3"),
        (dict(bf16={"enabled": True}), "bf16 with the pipeline engine"),
    ],
)
@pytest.mark.parametrize("optimizer", ["SM3", "OneBitAdam"])
def test_flattening_combinations_are_refused(tmp_path, changes, combination, optimizer):
    settings = tiny_settings(tmp_path, optimizer={"type": optimizer, "params": {"lr": 0.01}},
                             zero_allow_untested_optimizer=True, **changes)  # fmt: skip
    expected = f"{optimizer} cannot run with {combination}"
    if optimizer == "OneBitAdam" and "zero_optimization" in changes:
        expected = f"OneBitAdam cannot run with ZeRO stage {changes['zero_optimization']['stage']}"
    with pytest.raises(ConfigError, match=expected) as err:
        resolve(settings, 1)
    assert "stage 0" in str(err.value)


def test_zero3_with_the_pipeline_engine_is_refused(tmp_path):
    settings = tiny_settings(tmp_path, pipe_parallel_size=1, zero_optimization={"stage": 3})
    with pytest.raises(ConfigError, match="ZeRO stage 3 cannot be combined with the pipeline"):
        resolve(settings, 1)
