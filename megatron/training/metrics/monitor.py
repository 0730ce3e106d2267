"""Per-interval training figures: loss, skipped steps, throughput, TFLOP/s, MFU, ETA.

`TrainMonitor.step(...)` is called after every iteration; `record(...)` at each log interval
builds the training record (see `megatron/training/metrics/loggers/base.py`) and starts a new
interval.

The interval's loss is the mean over its applied steps (a skipped fp16 overflow step does not
count, as in Megatron and GPT-NeoX), or over all its steps when none was applied; an inf/NaN
loss in the interval is shown as it is, never averaged away or logged as a blank.

A step's tokens and FLOPs are the run's fixed `tokens_per_step` and `flops_per_token` unless
`step(..., work=)` gives that step's own (`flops.StepWork`: a sequence-length curriculum trains
on shorter sequences), so tokens/s, TFLOP/s and MFU count what was really computed.

A step's loss may come as a 0-dim device tensor (a train step's, `step/steps.py`): the monitor
keeps it as it is and reads the interval's losses on the host at `record`, all in one transfer
(`host_floats`), so the steps between two log records do not wait for the device.

Extra per-step figures (`step(..., extras={"moe_aux_loss": ...})`, the mixture-of-experts
router losses) are logged as their mean over the interval's steps, under their own names; one
given as a device tensor is summed on the device and read in the losses' transfer.
"""

from __future__ import annotations

import math
import time

import torch

from megatron.training.metrics.flops import throughput


def host_floats(values: list) -> list[float]:
    """`values` (Python numbers or 0-dim tensors) as floats: the tensors are copied to the host
    together, one synchronisation for all of them (none when there are none)."""
    tensors = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    out = [float(v) if i not in tensors else 0.0 for i, v in enumerate(values)]
    if tensors:
        stacked = torch.stack([values[i].detach().reshape(()).double() for i in tensors])
        for i, value in zip(tensors, stacked.tolist()):
            out[i] = value
    return out


def _as_pair(value) -> tuple:
    """An extra as (value, present): a device `(mean, present)` pair of a post-training
    metric (`objectives/base.py::MetricSums.step_means`), or a number, present when given."""
    if isinstance(value, torch.Tensor) and value.shape == (2,):
        return value[0], value[1]
    return value, 1.0


class TrainMonitor:
    """Accumulates one log interval."""

    def __init__(
        self,
        tokens_per_step: int,
        flops_per_token: float,
        world_size: int,
        peak_tflops: float | None,
        train_iters: int,
        clock=time.perf_counter,
    ):
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.world_size = world_size
        self.peak = peak_tflops
        self.train_iters = train_iters
        self.clock = clock
        self.tokens_trained = 0  # over the whole run, for the summary
        self.start = clock()
        self.settled: list[float] = []  # the last record's losses, on the host
        self._reset(self.start)

    def _reset(self, now: float) -> None:
        self.interval_start = now
        self.loss_sum = 0.0
        self.all_loss_sum = 0.0
        self.nonfinite_loss: float | None = None
        self.applied = 0
        self.skipped = 0
        self.steps = 0
        self.tokens = 0
        self.flops = 0.0
        self.extras: dict = {}  # name -> float, or a device (sum, steps present) pair
        self.host_extras: dict[str, tuple[float, float]] = {}
        self.pending: list = []  # (loss, applied) of the interval's steps, read at `record`

    def step(self, loss, applied: bool, extras: dict | None = None, work=None) -> None:
        """One step: `loss` a float or a 0-dim tensor (read at `record`)."""
        self.steps += 1
        tokens = work.tokens if work is not None else self.tokens_per_step
        self.tokens += tokens
        self.tokens_trained += tokens
        self.flops += work.flops if work is not None else tokens * self.flops_per_token
        for name, value in (extras or {}).items():
            self.extras[name] = self.extras.get(name, 0.0) + value
        self.pending.append((loss, applied))

    def settle(self) -> list[float]:
        """The interval's losses on the host (one transfer, which reads the extras too),
        folded into its sums."""
        pairs = [_as_pair(value) for value in self.extras.values()]
        read = host_floats([loss for loss, _ in self.pending] + [x for p in pairs for x in p])
        losses, extras = read[: len(self.pending)], read[len(self.pending) :]
        self.host_extras = {  # name -> (sum over the interval, steps that had it)
            name: (extras[2 * i], extras[2 * i + 1]) for i, name in enumerate(self.extras)
        }
        for loss, (_, applied) in zip(losses, self.pending):
            self._add(loss, applied)
        self.pending = []
        return losses

    def _add(self, loss: float, applied: bool) -> None:
        self.all_loss_sum += loss
        if not math.isfinite(loss) and self.nonfinite_loss is None:
            self.nonfinite_loss = loss
        if applied:
            self.loss_sum += loss
            self.applied += 1
        else:
            self.skipped += 1

    def _loss(self) -> float | None:
        if self.nonfinite_loss is not None:
            return self.nonfinite_loss
        if self.applied:
            return self.loss_sum / self.applied
        return self.all_loss_sum / self.steps if self.steps else None

    def record(self, iteration: int, lr, grad_norm, loss_scale, timers=None) -> dict:
        """The interval's record; its losses read on the host are left in `settled`."""
        self.settled = self.settle()
        now = self.clock()
        seconds = now - self.interval_start
        speed = throughput(
            self.tokens,
            seconds,
            self.flops / self.tokens if self.tokens else self.flops_per_token,
            self.world_size,
            self.peak,
        )
        per_step = seconds / max(self.steps, 1)
        record = {
            "iteration": iteration,
            "loss": self._loss(),
            "lr": lr,
            "grad_norm": grad_norm,
            "loss_scale": loss_scale,
            "skipped": self.skipped,
            "tokens_per_sec": speed.tokens_per_sec,
            "tflops_per_gpu": speed.tflops_per_gpu,
            "mfu": speed.mfu,
            "elapsed_s": now - self.start,
            "eta_s": max(0, self.train_iters - iteration) * per_step,
        }
        for name, (total, present) in self.host_extras.items():
            if present:
                record[name] = total / max(self.steps, 1)
        for name, ms in (timers or {}).items():
            record[f"time/{name}"] = ms
        if torch.cuda.is_available():  # the allocator's own count: no device sync
            record["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        self._reset(now)
        return record
