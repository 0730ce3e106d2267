"""Mamba's `A_log` and `D` stay fp32 inside fp16/bf16 runs (`mamba_selective_fp32_params`, as
GPT-NeoX trains its Mamba configs), on every DeepSpeed optimizer wrapper the trainer builds.

The real engines (`build_engine`) train a two-layer Mamba model on the CPU: bf16 at ZeRO 0
(`FP16_UnfusedOptimizer`), ZeRO 1 (`BF16_Optimizer`) and ZeRO 2 (`DeepSpeedZeroOptimizer`),
the pipeline engine at ZeRO 1, and fp16 (DeepSpeed's capability check answered "supported", as
in `test_fp16_engine_scaling.py`) at ZeRO 0, 1 and 2 and on the pipeline engine at ZeRO 0
and 1. For each, against things this code did not compute:

- the gradient the torch optimizer gets for A_log and D is autograd's fp32 gradient (summed
  over the micro-batches, hooked on the parameters) times one scalar (the loss scale's
  inverse), to fp32 precision; a trip through bf16 or fp16 would leave a residual of 1e-3;
- each update equals `torch.optim.AdamW`'s fp32 step from the same state and gradient, and the
  model's A_log and D are that result exactly (an fp32 copy, not a rounded one);
- A_log moved off the bf16 grid (it trained in fp32), every other weight is in the run's dtype,
  the optimizer's moments are fp32, the losses are finite and fall;
- a checkpoint saved and loaded resumes with fp32 A_log and D and the same next step.
"""

from __future__ import annotations

import pytest

from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings

pytestmark = pytest.mark.slow

STEPS = 5
FP16 = {"loss_scale": 0, "initial_scale_power": 8}
LAYOUTS = {
    "bf16_zero0": dict(precision="bfloat16", zero_optimization={"stage": 0}),
    "bf16_zero1": dict(precision="bfloat16", zero_optimization={"stage": 1}),
    "bf16_zero2": dict(precision="bfloat16", zero_optimization={"stage": 2}),
    "bf16_pipe_zero1": dict(
        precision="bfloat16", zero_optimization={"stage": 1}, pipe_parallel_size=1
    ),
    "fp16_zero0": dict(fp16=FP16, zero_optimization={"stage": 0}),
    "fp16_pipe_zero1": dict(fp16=FP16, zero_optimization={"stage": 1}, pipe_parallel_size=1),
    "fp16_pipe_zero0": dict(fp16=FP16, zero_optimization={"stage": 0}, pipe_parallel_size=1),
    "fp16_zero1": dict(fp16=FP16, zero_optimization={"stage": 1}),
    "fp16_zero2": dict(fp16=FP16, zero_optimization={"stage": 2}),
}
RESUMED = ("bf16_zero1", "fp16_zero2")


def _allow_fp16_on_cpu():
    from deepspeed.accelerator import get_accelerator

    type(get_accelerator()).is_fp16_supported = lambda self: True


def _engine(folder, layout):
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.setup.engine import build_engine

    settings = tiny_settings(
        folder,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        save=None,
        load=None,
        checkpoint_factor=None,
        attention_config=[[["mamba"], 2]],
        norm="rmsnorm",
        pos_emb="none",
        gradient_clipping=0.0,
        pipe_parallel_size=0,
        optimizer={"type": "AdamW", "params": {"lr": 2.0e-3, "betas": [0.9, 0.95]}},
        weight_decay=0.1,
        lr_decay_style="constant",  # a resumed step has the LR of the unbroken one
        warmup=0.0,
    )
    cfg = resolve({**settings, **LAYOUTS[layout]}, 1)
    assert cfg.model.mamba_selective_fp32_params  # GPT-NeoX's default
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    return build_engine(cfg, topology, cfg.training.train_iters), topology


def _batches(n):
    import torch

    g = torch.Generator().manual_seed(0)
    tokens, labels = torch.randint(0, 60, (2, 2, 32), generator=g)
    batch = ((tokens, torch.arange(32).expand(2, 32)), (labels, torch.ones(2, 32)))
    return iter([batch] * n)


def _marked(model):
    return [(n, p) for n, p in model.named_parameters() if n.endswith(("A_log", ".D"))]


class Recorder:
    """Autograd's gradients of A_log and D, and what the torch optimizer does with them."""

    def __init__(self, parts):
        import torch

        self.params = [p for _, p in _marked(parts.engine.module)]
        self.summed = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        for i, p in enumerate(self.params):
            p.register_hook(lambda grad, i=i: self._add(i, grad))
        self.optimizer = parts.optimizer
        self.step, self.steps = parts.optimizer.step, []
        parts.optimizer.step = self.record_step

    def _add(self, i, grad) -> None:  # None: the hook leaves the gradient as it is
        self.summed[i].add_(grad.float())

    def record_step(self, *args, **kwargs):
        import torch

        # ZeRO steps its groups one at a time (the optimizer then holds that group alone)
        groups = [g for g in self.optimizer.param_groups if g["name"] == "no_decay_fp32"]
        if not groups:
            return self.step(*args, **kwargs)
        group, masters = groups[0], groups[0]["params"]
        n = sum(p.numel() for p in self.params)
        before = torch.cat([m.detach().reshape(-1) for m in masters])[:n].clone()
        grad = torch.cat([m.grad.reshape(-1) for m in masters])[:n].clone()
        states = [{k: v.clone() for k, v in self.optimizer.state[m].items()} for m in masters]
        result = self.step(*args, **kwargs)
        after = torch.cat([m.detach().reshape(-1) for m in masters])[:n].clone()
        autograd = torch.cat([s.reshape(-1) for s in self.summed])
        for s in self.summed:
            s.zero_()
        hyper = {k: group[k] for k in ("lr", "betas", "eps", "weight_decay")}
        self.steps.append(dict(before=before, grad=grad, after=after, autograd=autograd,
                               states=states, hyper=hyper, masters=[m.numel() for m in masters],
                               dtypes={str(m.dtype) for m in masters},
                               moments={str(v.dtype) for m in masters
                                        for v in self.optimizer.state[m].values()
                                        if torch.is_tensor(v) and v.dim() > 0}))  # fmt: skip
        return result


def _torch_adamw(step: dict):
    """`torch.optim.AdamW`'s fp32 update of the recorded step's A_log and D."""
    import torch

    param = torch.nn.Parameter(step["before"].clone())
    param.grad = step["grad"].clone()
    adamw = torch.optim.AdamW([param], **step["hyper"])
    if step["states"][0]:  # one flat master (ZeRO, BF16_Optimizer) or one per tensor
        keys = [k for k in step["states"][0] if k != "step"]
        state = {k: torch.cat([s[k].reshape(-1) for s in step["states"]])[: param.numel()]
                 for k in keys}  # fmt: skip
        state["step"] = step["states"][0]["step"].clone()
        adamw.state[param] = state
    adamw.step()
    return param.detach()


def _train(folder, layout):
    import torch

    from megatron.training.step.steps import engine_steps

    parts, topology = _engine(folder, layout)
    recorder = Recorder(parts)
    steps = engine_steps(parts.engine, topology)
    init = {n: p.detach().clone() for n, p in _marked(parts.engine.module)}
    buckets = []
    zero = parts.engine.optimizer
    if hasattr(zero, "ipg_buckets"):  # a ZeRO 1/2 wrapper's reduction buckets, by dtype
        reduce = zero.reduce_ready_partitions_and_remove_grads

        def sized(*args, **kwargs):  # what the fp32 bucket holds while gradients reduce
            bucket = zero.ipg_buckets.get(torch.float32)
            buckets.extend(b.numel() for b in (bucket.buffer if bucket else []))
            return reduce(*args, **kwargs)

        zero.reduce_ready_partitions_and_remove_grads = sized
    losses = [float(steps.train_step(_batches(2))) for _ in range(STEPS)]
    marked = _marked(parts.engine.module)
    model = torch.cat([p.detach().reshape(-1) for _, p in marked])
    out = {
        "losses": losses,
        "fp32_bucket": max(buckets, default=0),
        "fp32_numel": sum(p.numel() for _, p in marked),
        "applied": len(recorder.steps),
        "marked": {n: str(p.dtype) for n, p in marked},
        "others": {
            str(p.dtype) for n, p in parts.engine.module.named_parameters() if n not in dict(marked)
        },
        "wrapper": type(parts.engine.optimizer).__name__,
        "groups": [g["name"] for g in parts.optimizer.param_groups],
        "masters": recorder.steps[-1]["dtypes"],
        "moments": recorder.steps[-1]["moments"],
        "grad_residual": [],
        "grad_scale": [],
        "adamw_error": [],
        "model_vs_master": float((model - recorder.steps[-1]["after"]).abs().max()),
        "off_bf16_grid": float((model != model.to(torch.bfloat16).float()).float().mean()),
        "moved": min(float((p.detach() - init[n]).abs().max()) for n, p in marked),
    }
    for step in recorder.steps:
        g, a = step["grad"], step["autograd"]
        scale = float(g @ a / (a @ a))
        out["grad_residual"].append(float((g - scale * a).norm() / g.norm()))
        out["grad_scale"].append(scale)
        out["adamw_error"].append(float((_torch_adamw(step) - step["after"]).abs().max()))
    if layout in RESUMED:
        out["resume"] = _resume(parts, steps, folder, layout)
    return out


def _resume(parts, steps, folder, layout):
    """Save and load as a run does (`CheckpointIO`), into a fresh engine; take the same next
    step on both."""
    import torch

    from megatron.training.checkpoint.checkpoint_io import CheckpointIO
    from megatron.training.step.steps import engine_steps

    CheckpointIO(parts.engine, save_dir=str(folder / "ckpt")).save(STEPS, {})
    again, topology = _engine(folder / "again", layout)
    CheckpointIO(again.engine, save_dir=None).load(str(folder / "ckpt"))
    loaded = {n: str(p.dtype) for n, p in _marked(again.engine.module)}
    same = all(
        torch.equal(p.detach(), q.detach())
        for (_, p), (_, q) in zip(_marked(parts.engine.module), _marked(again.engine.module))
    )
    next_loss = float(steps.train_step(_batches(2)))
    resumed_loss = float(engine_steps(again.engine, topology).train_step(_batches(2)))
    after = max(
        float((p.detach() - q.detach()).abs().max())
        for (_, p), (_, q) in zip(_marked(parts.engine.module), _marked(again.engine.module))
    )
    return dict(loaded=loaded, same=same, next=next_loss, resumed=resumed_loss, after=after)


def _every_layout(rank, world_size, folder):
    from pathlib import Path

    _allow_fp16_on_cpu()
    return {layout: _train(Path(folder) / layout, layout) for layout in LAYOUTS}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("mamba_fp32"))
    return run_distributed(_every_layout, 1, folder, timeout=900)[0]


WRAPPERS = {
    "bf16_zero0": "FP16_UnfusedOptimizer",
    "bf16_zero1": "BF16_Optimizer",
    "bf16_zero2": "DeepSpeedZeroOptimizer",
    "bf16_pipe_zero1": "BF16_Optimizer",
    "fp16_zero0": "FP16_UnfusedOptimizer",
    "fp16_pipe_zero1": "DeepSpeedZeroOptimizer",
    "fp16_pipe_zero0": "FP16_UnfusedOptimizer",
    "fp16_zero1": "DeepSpeedZeroOptimizer",
    "fp16_zero2": "DeepSpeedZeroOptimizer",
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_log_and_d_stay_fp32_and_train(trained, layout):
    r = trained[layout]
    half = "torch.bfloat16" if layout.startswith("bf16") else "torch.float16"
    assert r["wrapper"] == WRAPPERS[layout]
    assert r["groups"] == ["decay", "no_decay", "no_decay_fp32"]
    assert set(r["marked"].values()) == {"torch.float32"} and len(r["marked"]) == 4
    assert r["others"] == {half}
    assert r["masters"] == {"torch.float32"} and r["moments"] == {"torch.float32"}
    assert r["applied"] == STEPS
    assert all(x == x and abs(x) != float("inf") for x in r["losses"])
    assert r["losses"][-1] < r["losses"][0]
    # The optimizer got autograd's fp32 gradient, times the loss scale's inverse
    assert max(r["grad_residual"]) < 1e-5
    unscale = 1.0 if layout.startswith("bf16") else 2.0 ** -FP16["initial_scale_power"]
    assert r["grad_scale"] == pytest.approx([unscale] * STEPS, rel=1e-5)
    # Each update is torch AdamW's in fp32, and the model holds it unrounded
    assert max(r["adamw_error"]) < 1e-6
    assert r["model_vs_master"] == 0.0
    assert r["moved"] > 0 and r["off_bf16_grid"] > 0.5
    # ZeRO 1/2's fp32 reduction bucket is the fp32 parameters' size, not reduce_bucket_size
    assert r["fp32_bucket"] <= r["fp32_numel"]


@pytest.mark.parametrize("layout", RESUMED)
def test_a_resumed_run_keeps_them_fp32_and_continues(trained, layout):
    r = trained[layout]["resume"]
    assert set(r["loaded"].values()) == {"torch.float32"} and r["same"]
    assert r["resumed"] == pytest.approx(r["next"], rel=1e-6)
    assert r["after"] == 0.0
