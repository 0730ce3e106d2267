"""A step whose loss or gradient norm is inf/NaN changes nothing, and no checkpoint holds one.

`NonFiniteSteps.install()` wraps the engine's `_take_model_step` (the one method both of
DeepSpeed's engines call at the end of a global batch: `PipelineEngine` from its
`OptimizerStep` instruction, the plain engine from `step()` at the accumulation boundary).
Before the update it asks, on every rank: is this rank's share of the loss non-finite, or,
where DeepSpeed wraps nothing around our optimizer (fp32 without ZeRO, whose DeepSpeed path
checks nothing), is the global gradient norm non-finite? Both answers stay on the device, in
one flag that is all-reduced (MAX) over the whole world on the device, so every rank takes the
same decision; reading that flag is the step's one host synchronisation (`docs/performance.md`).
The same all-reduce carries the SIGTERM/SIGINT flag of a `StopRequest` given as `stop`
(`megatron/training/loop/signals.py`), so agreeing on it costs nothing more.

A bad step is skipped through DeepSpeed's own overflow path: the engine's step runs with our
optimizer's `step` replaced by a no-op that marks the engine's optimizer as overflowed, so
DeepSpeed clears the gradients, leaves the LR schedule where it was, reports
`was_step_applied() == False` and counts the step as skipped; weights and optimizer state
are untouched. (DeepSpeed's fp16, bf16 and ZeRO optimizers also skip a step whose own norm
is inf/NaN; that skip is reported the same way.) Skipped steps are counted, and the run
stopped after `max_consecutive_skipped_steps` in a row, by `SkippedStepGuard`
(`loss_scaling.py`) through `callbacks.SkippedStepsCallback`.

`state_is_finite(engine, optimizer)` (collective) is asked before every checkpoint save.
"""

from __future__ import annotations

import torch

from megatron.parallel.comm import all_reduce
from megatron.parallel.host_values import world_group
from megatron.training.step.grad_norm import STEP_GRAD_NORM, WRAPPER_CHECKS, global_grad_norm


def _nonfinite(value, device) -> torch.Tensor:
    """A 0-dim bool tensor on `device`: does `value` (None, a number, a tensor or a list of
    them) hold inf/NaN? Computed on the device, without reading anything back."""
    if value is None:
        return torch.zeros((), dtype=torch.bool, device=device)
    if isinstance(value, list | tuple):
        flags = [_nonfinite(v, device) for v in value]
        return torch.stack(flags).any() if flags else _nonfinite(None, device)
    value = torch.as_tensor(value).detach()
    return ~torch.isfinite(value.to(device)).all()


class NonFiniteSteps:
    """Skips (on every rank) a step whose loss or gradient norm is not finite.

    `optimizer` is ours (the one given to `deepspeed.initialize`); `local_loss()` returns
    this rank's summed loss of the current global batch so far (None where it has none, e.g.
    a pipeline stage other than the last). `stop`: a `StopRequest` whose flag rides along.
    """

    def __init__(self, engine, optimizer, topology, local_loss, stop=None):
        self.engine, self.optimizer = engine, optimizer
        self.topology, self.local_loss = topology, local_loss
        self.stop = stop
        self.skipped = 0

    def install(self) -> None:
        take_step = self.engine._take_model_step

        def guarded_step(lr_kwargs=None):
            try:
                if self._bad_anywhere():
                    self._skip(take_step, lr_kwargs)
                else:
                    take_step(lr_kwargs)
            finally:
                self.engine.__dict__.pop(STEP_GRAD_NORM, None)  # never seen by a later step
                checks = self._wrapper_checks()
                if checks is not None:  # nor what was computed for the wrapper's step
                    checks.clear()

        self.engine._take_model_step = guarded_step

    def _bad_here(self) -> torch.Tensor:
        """This rank's verdict as a 0-dim bool tensor on the engine's device."""
        device = self.engine.device
        bad = _nonfinite(self.local_loss(), device)
        if self.engine.optimizer is self.optimizer:  # no DeepSpeed wrapper checks the grads
            params = [p for p in self.engine.module.parameters() if p.grad is not None]
            norm = global_grad_norm(params, self.topology)
            self.engine._global_grad_norm = norm  # the step's norm, shown in the logs
            setattr(self.engine, STEP_GRAD_NORM, norm)  # reused by the clipping of this step
            bad = bad | _nonfinite(norm, device)
        return bad

    def _wrapper_checks(self):
        """The DeepSpeed wrapper's own checks moved to the device (`grad_norm.ZeroStepChecks`),
        or None."""
        return getattr(self.engine.optimizer, WRAPPER_CHECKS, None)

    def _bad_anywhere(self) -> bool:
        """Whether any rank's step is bad (and, with `stop`, whether any rank received a
        signal, with the flags that ride on it): one all-reduce on the device, one read,
        which also brings back the DeepSpeed wrapper's own checks where it has them."""
        bad = self._bad_here()
        riders = self.stop.flags() if self.stop is not None else []
        checks = self._wrapper_checks()
        # agreed as the wrapper agrees them (before the all-reduce: the step's collective order)
        theirs = checks.on_device() if checks is not None else bad.new_zeros(0, dtype=torch.float)
        # host flags as fills on the device, not copies to it
        flags = [bad] + [
            torch.full((), r.local(), dtype=torch.bool, device=bad.device) for r in riders
        ]
        agreed = all_reduce(torch.stack(flags).to(torch.int32), world_group(), op="max")
        values = torch.cat([agreed.float(), theirs]).tolist()  # the one read
        bad_anywhere, *carried = values[: len(flags)]
        for rider, value in zip(riders, carried):
            rider.carried(bool(value))
        if checks is not None:
            checks.read(values[len(flags) :])
        return bool(bad_anywhere)

    def _skip(self, take_step, lr_kwargs) -> None:
        """DeepSpeed's step with our optimizer's update made a no-op marked as an overflow."""
        wrapper, optimizer = self.engine.optimizer, self.optimizer

        def no_update(*args, **kwargs):
            wrapper.overflow = True  # DeepSpeed: no LR step, step not applied, skipped += 1

        own_step = optimizer.__dict__.get("step")  # an instance-level wrapper, if any
        optimizer.step = no_update  # shadows the method for this one step
        try:
            take_step(lr_kwargs)
        finally:
            if own_step is None:
                del optimizer.step
            else:
                optimizer.step = own_step
            if wrapper is optimizer:  # a plain torch optimizer has no overflow flag of its own
                optimizer.__dict__.pop("overflow", None)
        self.skipped += 1


def _local_tensors(engine, optimizer):
    for p in engine.module.parameters():
        yield getattr(p, "ds_tensor", p)  # ZeRO-3: this rank's partition
    for group in optimizer.param_groups:
        yield from group["params"]  # fp32 master weights under bf16/ZeRO
    for state in optimizer.state.values():
        yield from (v for v in state.values() if torch.is_tensor(v) and v.is_floating_point())


def _extremes(tensors, device) -> torch.Tensor:
    """The smallest and largest value of each non-empty tensor, as fp32 on `device`.

    A NaN shows in both (`aminmax` propagates NaN), an inf in the largest, a -inf in the
    smallest: a non-finite value anywhere makes this small tensor non-finite, without the
    element-wise bool copy `isfinite(t)` would make of each tensor (0.9 GB for the flat fp32
    partition of a 7B model at tp4 dp2) and without a read per tensor.
    """
    ends = [torch.stack(torch.aminmax(t)).float().to(device) for t in tensors if t.numel()]
    return torch.cat(ends) if ends else torch.zeros(1, device=device)


@torch.no_grad()
def state_is_finite(engine, optimizer) -> bool:
    """Whether every weight and optimizer-state tensor of every rank is finite (collective):
    one flag agreed over the world on the device, one read."""
    extremes = _extremes(_local_tensors(engine, optimizer), engine.device)
    bad = (~torch.isfinite(extremes).all()).to(torch.int32)
    return not all_reduce(bad, world_group(), op="max").item()
