"""The common training step reads one value back from the device: the non-finite flag.

On a GPU every read of a device value on the host (`.item()`, `float()`, `bool()`,
`.tolist()`, an op whose output size depends on the values) waits for the device to finish all
the work queued before it, so a step that reads more than it must stalls the device as often.
These tests count the reads (`tests/device_costs.py::HostReads`) while the real trainer
steps, on both DeepSpeed engines at fp32 (the path where our own guard computes the gradient
norm), and while the training loop logs every few steps: a step that does not log adds none
(`docs/performance.md` lists what each step reads and why). With one data-parallel replica
the steps also copy no gradient into a flat buffer (DeepSpeed's all-reduce over a group of one,
the identity, is switched off).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.device_costs import HostReads
from tests.distributed import run_distributed
from tests.tiny import resolve, tiny_settings


class FlatGradients(TorchDispatchMode):
    """Counts the concatenations of at least `numel` elements (a flattened gradient bucket)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.cat.default and out.numel() >= self.numel:
            self.count += 1
        return out


def _reads_per_step(rank, world_size, folder):
    from megatron.data import build_tokenizer
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything
    from megatron.training.loop.signals import StopRequest
    from megatron.training.setup.batches import BatchSettings
    from megatron.training.setup.data import BatchFactory, build_datasets
    from megatron.training.setup.engine import build_engine
    from megatron.training.step.nonfinite import NonFiniteSteps
    from megatron.training.step.steps import engine_steps

    out = {}
    for pp in (0, 1):
        settings = tiny_settings(f"{folder}/{pp}", save=None, load=None, train_iters=5,
                                 pipe_parallel_size=pp, steps_per_print=1000)  # fmt: skip
        cfg = resolve(settings, world_size)
        topology = initialize_distributed(cfg)
        seed_everything(cfg.training.seed)
        parts = build_engine(cfg, topology, 5)
        steps = engine_steps(parts.engine, topology)
        stop = StopRequest()  # not installed: the test sets what a signal would
        NonFiniteSteps(parts.engine, parts.optimizer, topology, steps.local_loss, stop).install()
        batch = BatchSettings.from_config(cfg, build_tokenizer(cfg).eod)
        device = parts.engine.device
        batches = BatchFactory(cfg, topology, batch, device)(build_datasets(cfg, 5)[0], 0)
        steps.train(batches)  # the first step builds what later steps reuse
        state = parts.optimizer.state.values()
        counters = [s["step"] for s in state if torch.is_tensor(s.get("step"))]
        losses, agreed = [], []
        weights = sum(p.numel() for p in parts.engine.module.parameters())
        with FlatGradients(weights // 2) as flat, HostReads(exempt=counters) as reads:
            for signal in (None, None, 15):
                stop.received = signal
                losses.append(steps.train(batches))
                agreed.append(stop.agreed())  # as the loop asks after each step
        out[pp] = (reads.count / 3, [float(loss) for loss in losses], agreed, steps.step_applied)
        out[pp] += (flat.count,)
    return out


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    """Three steps on each engine (one rank), counted."""
    return run_distributed(_reads_per_step, 1, str(tmp_path_factory.mktemp("steps")))[0]


def test_one_replica_flattens_no_gradients(stepped):
    for pp, result in stepped.items():
        assert result[-1] == 0, f"pipe_parallel_size {pp}: gradients flattened {result[-1]}x"


def test_a_train_step_reads_one_value_on_both_engines(stepped):
    """The non-finite step check's flag (loss and gradient norm together, agreed on the
    device over the world, with the SIGTERM/SIGINT flag riding along) is the one read; the
    loss stays on the device, and the loop's stop question is answered without a read."""
    for pp, (reads, losses, agreed, applied, _) in stepped.items():
        assert reads == 1, f"pipe_parallel_size {pp}: {reads} host reads per step"
        assert all(0 < loss < 20 for loss in losses) and applied
        assert agreed == [False, False, True]


class _Steps:
    step_applied = True

    def train(self, batches):
        return torch.tensor(2.0) + next(batches)


class _Loggers:
    def __init__(self):
        self.records, self.texts = [], []

    def log_train(self, record):
        self.records.append(record)

    def log_text(self, text):
        self.texts.append(text)


def test_the_loop_reads_losses_only_when_it_logs():
    """With `log_interval` 4, steps 1-3 read nothing; step 4 reads its interval's four losses in
    one transfer, and the run's result still holds every loss as a float. After step 1 a line
    says when the next comes (the start-up report was the last one), reading nothing either."""
    from megatron.training.loop.callbacks import LoggingCallback
    from megatron.training.loop.train_loop import TrainLoop, TrainState
    from megatron.training.metrics.monitor import TrainMonitor

    class Engine:
        def get_global_grad_norm(self):
            return None

        def fp16_enabled(self):
            return False

    class Schedule:
        def get_lr(self):
            return 1.0

    ticks = iter(range(100))  # each clock read 10 s after the last
    monitor = TrainMonitor(8, 1.0, world_size=1, peak_tflops=None, train_iters=6,
                           clock=lambda: 10.0 * next(ticks))  # fmt: skip
    loggers = _Loggers()
    reads = []

    class Count(LoggingCallback):
        def after_step(self, loop):
            with HostReads() as counted:
                super().after_step(loop)
            reads.append(counted.count)

    loop = TrainLoop(
        steps=_Steps(), engine=Engine(), lr_scheduler=Schedule(),
        batches=iter(torch.arange(6.0)), state=TrainState(), train_iters=6, global_batch=1,
        guard=None, loggers=loggers, callbacks=[Count(monitor, loggers, log_interval=4)],
    )  # fmt: skip
    with HostReads() as stepping:
        loop.run()
    assert reads == [0, 0, 0, 1, 0, 0]
    assert [r["loss"] for r in loggers.records] == [3.5, 6.5]  # steps 1-4, then 5-6 at the end
    assert loop.losses == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert stepping.count == 2  # the two records: the end has nothing left to read
    assert loggers.texts == [
        "first step done in 10.0 s (iteration 1 of 6); the next line comes at iteration 4, "
        "in about 0:00:30 at that pace"
    ]
