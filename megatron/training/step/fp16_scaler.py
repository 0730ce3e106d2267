"""fp16 loss scaling that does what the `fp16` section says on every engine path.

Which DeepSpeed 0.19.8 wrapper scales the loss of our optimizers (never FusedAdam):

- ZeRO 1/2/3: `DeepSpeedZeroOptimizer`(`_Stage3`) scales the loss in `engine.backward` with a
  `DynamicLossScaler` built from the section (`initial_scale_power`, `loss_scale_window`,
  `hysteresis`, `consecutive_hysteresis`, `min_loss_scale`); an overflow at the minimum raises.
- ZeRO 0, plain and pipeline engine: `FP16_UnfusedOptimizer`. There DeepSpeed 0.19.8
  (a) never scales the loss (`engine.backward` scales it for ZeRO optimizers only) but still
  divides the gradients by the scale before the step, so every update is the scale times too
  small and nothing guards against underflow; (b) updates a dynamic scale with its own rule,
  which ignores `hysteresis`; (c) grows the scale before unscaling, so that step divides by
  twice the scale it backpropagated; (d) reports the gradient norm times the scale.

`install_loss_scaler(engine)` makes both paths one rule. The scaler is DeepSpeed's
`DynamicLossScaler` from the arguments DeepSpeed parsed from the engine's own config
(`engine.dynamic_loss_scale_args()`):

- an overflowing step is skipped; the scale halves once `hysteresis` overflows have been seen
  since the scale last grew (with `consecutive_hysteresis`: since the last clean step);
- a clean step `loss_scale_window` steps after the last overflow doubles the scale (and
  refills the hysteresis);
- the scale never drops below `min_loss_scale`, and stays there instead of raising: the
  skipped-step limit (`max_consecutive_skipped_steps`) stops a run that keeps overflowing,
  with an explanation.

A resumed ZeRO run gets the same rule back after DeepSpeed's load put the checkpoint's pickled
scaler in its place (`keep_configured_scaler`), with the loaded scale and counters.

On the ZeRO-0 path the model's `loss_fn` also scales the gradient flowing back from each
loss by the current scale (what `FP16_UnfusedOptimizer.backward` would do), a clean step's
scale update waits until the step has unscaled with the scale it used, and the recorded
gradient norm is unscaled.
"""

from __future__ import annotations

import torch

from megatron.parallel.comm import all_reduce
from megatron.training.step.grad_norm import WRAPPER_CHECKS, global_grad_norm

HYSTERESIS_STATE_KEY = "megatron_loss_scaler_hysteresis"
"""Where the hysteresis count goes in FP16_UnfusedOptimizer's state dict (DeepSpeed's own
keys hold the scale, the iteration and the last overflow)."""


def build_loss_scaler(dynamic_loss_args: dict):
    """DeepSpeed's `DynamicLossScaler` for DeepSpeed's dynamic loss arguments, flooring at
    `min_scale` instead of raising."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    return DynamicLossScaler(**dynamic_loss_args, raise_error_at_min_scale=False, dtype=torch.half)


def install_loss_scaler(engine):
    """Give the engine's fp16 optimizer wrapper the scaling described in the module docstring;
    returns the dynamic scaler (None for fp32/bf16 or a static scale)."""
    if not engine.fp16_enabled():
        return None
    dynamic = engine.dynamic_loss_scale()
    scaler = build_loss_scaler(engine.dynamic_loss_scale_args()) if dynamic else None
    optimizer = engine.optimizer
    if hasattr(optimizer, "loss_scale_config"):  # FP16_UnfusedOptimizer (or FP16_Optimizer)
        UnfusedScaling(optimizer, engine.module, scaler)
    elif getattr(optimizer, "loss_scaler", None) is not None:  # the ZeRO optimizers
        if scaler is not None:
            optimizer.loss_scaler = scaler
    else:
        raise RuntimeError(
            f"fp16: DeepSpeed's optimizer wrapper {type(optimizer).__name__} is not one this "
            "trainer knows how to configure (loss scaling and hysteresis, loss_scale_window, "
            "min_loss_scale would not be applied as configured)"
        )
    return scaler


LOADED_COUNTERS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")
"""What a resumed run takes from a checkpoint's loss scaler; the rules stay the config's."""


def keep_configured_scaler(engine) -> None:
    """After a checkpoint load: the ZeRO optimizers' `load_state_dict` replaces their loss
    scaler with the one pickled in the checkpoint, built by the run that saved it (GPT-NeoX's
    raises at the minimum scale; an earlier run of ours may have had another window,
    hysteresis or minimum). Put the scaler of this run's config back, carrying the loaded
    scale and counters (`LOADED_COUNTERS`)."""
    optimizer = engine.optimizer
    if not (engine.fp16_enabled() and engine.dynamic_loss_scale()):
        return
    if hasattr(optimizer, "loss_scale_config"):  # ZeRO 0: UnfusedScaling loads into its own
        return
    loaded = getattr(optimizer, "loss_scaler", None)
    if loaded is None:
        return
    scaler = build_loss_scaler(engine.dynamic_loss_scale_args())
    for name in LOADED_COUNTERS:
        if hasattr(loaded, name):
            setattr(scaler, name, getattr(loaded, name))
    optimizer.loss_scaler = scaler


class UnfusedScaling:
    """Loss scaling for DeepSpeed's ZeRO-0 fp16 wrapper (items (a)-(d) of the module docstring).

    The wrapper keeps the scale, iteration count and last overflow in `loss_scale_config` and
    reads the scale from there when unscaling; its `load_state_dict` and `loss_scale` setter
    write them. They are copied into the scaler before each update and back after it; only
    the hysteresis count is the scaler's own, and it is added to the wrapper's state dict.
    """

    FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter")

    def __init__(self, optimizer, model, scaler=None):
        self.optimizer, self.scaler = optimizer, scaler
        self.state = optimizer.loss_scale_config
        self.clean_step_pending = False
        self._step, self._save, self._load = (
            optimizer.step,
            optimizer.state_dict,
            optimizer.load_state_dict,
        )
        optimizer.step = self.step
        self._scale_backward_of(model)
        if scaler is not None:
            optimizer._update_scale = self.update_scale
            optimizer.state_dict = self.state_dict
            optimizer.load_state_dict = self.load_state_dict
            optimizer.loss_scaler = scaler

    def _scale_backward_of(self, model) -> None:
        loss_fn, state = model.loss_fn, self.state

        def scaled_loss_fn(*args, **kwargs):
            loss = loss_fn(*args, **kwargs)
            if loss.requires_grad:
                # The value (logged, returned) stays the loss; its gradient is the scale.
                loss.register_hook(lambda grad: grad * state.cur_scale)
            return loss

        model.loss_fn = scaled_loss_fn

    def step(self, *args, **kwargs):
        self.clean_step_pending = False
        overflow = self._step(*args, **kwargs)
        if not overflow:
            self.optimizer._global_grad_norm /= self.state.cur_scale  # norm of scaled grads
        if self.clean_step_pending:
            self._update(False)
            self.clean_step_pending = False
        return overflow

    def update_scale(self, skip: bool) -> None:
        """The wrapper's `_update_scale`: an overflow now, a clean step after unscaling."""
        if skip:
            self._update(True)
        else:
            self.clean_step_pending = True

    def _update(self, overflow: bool) -> None:
        for name in self.FIELDS:
            setattr(self.scaler, name, getattr(self.state, name))
        self.scaler.update_scale(overflow)
        for name in self.FIELDS:
            setattr(self.state, name, getattr(self.scaler, name))

    def state_dict(self):
        sd = self._save()
        sd[HYSTERESIS_STATE_KEY] = self.scaler.cur_hysteresis
        return sd

    def load_state_dict(self, sd, *args, **kwargs):
        out = self._load(sd, *args, **kwargs)
        self.scaler.cur_hysteresis = int(sd.get(HYSTERESIS_STATE_KEY, self.scaler.delayed_shift))
        return out


def step_on_device(optimizer, topology) -> None:
    """`FP16_UnfusedOptimizer`'s step (fp16 at ZeRO 0, bf16 at ZeRO 0 on the plain engine)
    with one host read and the true global gradient norm.

    DeepSpeed 0.19.8's step reads once per parameter (`if has_inf_or_nan(grad)`), once for the
    agreed overflow flag and twice per parameter group for its gradient norm (~150 reads per
    step at 160M, 32 on the 2-layer tiny model). That norm is also wrong under model
    parallelism: its filters look for the parameters' tensor-parallel and tied-copy marks on
    the gradients, which carry none, so tensor-parallel ranks above 0 add nothing and tied
    copies count twice (at tp 2 the tiny model's norm came out 0.71 of the true one), and
    experts are left out. Here the norm is `global_grad_norm` (each gradient once, as on
    every other path), in fp32 on the device; inf/NaN anywhere makes it non-finite, so it is
    the overflow flag too. The flag is agreed over DeepSpeed's overflow groups on the device
    and read with the norm, in the non-finite step's one read (`UnfusedStepChecks`); the rest
    is DeepSpeed's step.
    """
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    if not isinstance(optimizer, FP16_UnfusedOptimizer) or optimizer.fused_lamb_legacy:
        return

    UnfusedStepChecks(optimizer, topology)


class UnfusedStepChecks:
    """The overflow flag and norm of `step_on_device`, computed on the device (`on_device`) and
    read with the non-finite step's flag (`read`, found by `WRAPPER_CHECKS`), so the step reads
    nothing of its own; a step without them computes and reads them itself."""

    def __init__(self, optimizer, topology):
        self.optimizer, self.topology, self.known = optimizer, topology, None
        optimizer.step = self.step
        setattr(optimizer, WRAPPER_CHECKS, self)

    def on_device(self) -> torch.Tensor:
        """[overflow anywhere, norm of the scaled gradients] as fp32 on the device."""
        optimizer = self.optimizer
        params = [p for group in optimizer.fp16_groups for p in group]
        norm = global_grad_norm(params, self.topology)  # of the scaled gradients
        flag = (~torch.isfinite(norm)).to(torch.uint8).reshape(1)
        checker = optimizer.overflow_checker
        flag = _agree_overflow(checker, flag, checker.has_moe_params)
        return torch.cat([flag.float(), norm.reshape(1)])

    def read(self, values) -> None:
        self.known = values

    def clear(self) -> None:
        self.known = None

    def step(self, closure=None):
        optimizer = self.optimizer
        optimizer.overflow = False
        known, self.known = self.known, None
        overflow, norm = known if known is not None else self.on_device().tolist()
        if overflow:
            return optimizer._skip_invalid_grad_norm()
        _fp32_grads(optimizer)
        optimizer._global_grad_norm = norm
        optimizer._update_scale(False)
        _unscale_and_clip(optimizer, norm)
        optimizer.optimizer.step()
        _copy_back(optimizer)
        return optimizer.overflow


def _fp32_grads(optimizer) -> None:
    """The 16-bit gradients, as fp32 gradients of the master weights (zeros where none)."""
    for fp32_group, fp16_group in zip(optimizer.fp32_groups, optimizer.fp16_groups, strict=True):
        for fp32, fp16 in zip(fp32_group, fp16_group, strict=True):
            grad = fp16.grad if fp16.grad is not None else torch.zeros_like(fp16)
            fp32.grad = grad.to(fp32.dtype)


def _unscale_and_clip(optimizer, norm: float) -> None:
    """DeepSpeed's `unscale_and_clip_grads`: the fp32 gradients times 1 / its combined scale
    (the loss scale, times the clipping factor where the norm is above `clip_grad`), which it
    computes from the host norm; the multiplication in one fused pass instead of one per
    parameter after the step's read, and none by exactly 1 (bf16, and fp16 at scale 1)."""
    combined = optimizer.unscale_and_clip_grads(norm, apply_scale=False)
    if combined != 1.0:
        grads = [p.grad for group in optimizer.fp32_groups for p in group if p.grad is not None]
        torch._foreach_mul_(grads, 1.0 / combined)


def _copy_back(optimizer) -> None:
    """The stepped master weights into the 16-bit weights, in one fused pass (a copy per
    parameter was some 450 host operations per step at 160M, while the GPU waited); the fp32
    gradients dropped."""
    masters, weights = [], []
    for fp32_group, fp16_group in zip(optimizer.fp32_groups, optimizer.fp16_groups, strict=True):
        for fp32, fp16 in zip(fp32_group, fp16_group, strict=True):
            fp32.grad = None
            masters.append(fp32)
            weights.append(fp16)
    with torch.no_grad():
        torch._foreach_copy_(weights, masters)


def _agree_overflow(checker, flag: torch.Tensor, has_moe_params: bool) -> torch.Tensor:
    """`flag` reduced (MAX) over the groups DeepSpeed 0.19.8's `CheckOverflow.has_overflow`
    reduces its flag over, in the same order."""
    from deepspeed import comm as dist
    from deepspeed.utils import groups

    engine, mpu = checker.deepspeed, checker.mpu
    if has_moe_params:
        all_reduce(flag, groups._get_max_expert_parallel_group(), op="max")
    if checker.zero_reduce_scatter:
        all_reduce(flag, dist.get_world_group(), op="max")
    elif mpu is not None:
        if engine is not None and _backward_allreduce(engine) is False:
            all_reduce(flag, mpu.get_data_parallel_group(), op="max")
        all_reduce(flag, mpu.get_model_parallel_group(), op="max")
    elif engine is not None and engine.enable_backward_allreduce is False:
        all_reduce(flag, dist.get_world_group(), op="max")
    return flag


def _backward_allreduce(engine):
    """Whether the engine all-reduces gradients in backward (off: the ranks' gradients differ)."""
    if hasattr(engine, "pipeline_enable_backward_allreduce"):
        return engine.pipeline_enable_backward_allreduce
    return engine.enable_backward_allreduce
