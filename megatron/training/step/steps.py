"""One training or evaluation step (a global batch), for each kind of DeepSpeed engine.

`PipelineSteps` drives DeepSpeed's pipeline engine (`train_batch`/`eval_batch`, which pull
`gradient_accumulation_steps` micro-batches from the iterator and return the loss averaged
over micro-batches and data-parallel ranks). `PlainSteps` drives the ordinary engine (ZeRO
0-3): forward, `loss_fn`, backward and `step` per micro-batch, then the same averaging.
Both return the loss as a Python float, equal on every rank; `train` is the train step that
returns it as a 0-dim device tensor instead, which the training loop reads on the host only
when it logs (no host synchronisation of its own, `docs/performance.md`). During a train step,
`local_loss()` is this rank's summed loss of the global batch so far (what the non-finite
step check, `nonfinite.py`, reads just before the optimizer step). With mixture-of-experts
layers, `moe_losses` holds the last train step's router losses for the log (`moe_grads.py`).

With a post-training objective (`objectives/`), `objective_metrics` holds the last train
step's metrics (DPO's rewards, margins, accuracy, ...) on the device, which the log reads with
the losses, and `take_metrics()` those gathered since (an evaluation's) as floats. With a
reference model (`reference.py`), a step first reads its `gradient_accumulation_steps`
micro-batches, has the reference fill in their reference log-probabilities, then trains (or
evaluates) the policy on exactly those micro-batches.
"""

from __future__ import annotations

import torch

from megatron.parallel.comm import all_reduce
from megatron.parallel.host_values import reduce_host
from megatron.training.step.moe_grads import moe_loss_record, prepare_moe_step


class EngineSteps:
    """Train and evaluate one global batch with a DeepSpeed engine."""

    def __init__(
        self,
        engine,
        dp_group=None,
        dp_size: int = 1,
        topology=None,
        objective=None,
        reference=None,
        curriculum=None,
    ):
        self.engine = engine
        self.dp_group = dp_group
        self.dp_size = dp_size
        self.topology = topology
        self.objective = objective
        self.reference = reference
        self.curriculum = curriculum  # sets the train steps' length (setup/curriculum.py)
        self.moe_losses: dict[str, float] = {}
        self.objective_metrics: dict[str, torch.Tensor] = {}  # on the device, read at logs

    def _before_train_step(self) -> None:
        prepare_moe_step(self.engine.module, self.engine.gradient_accumulation_steps())

    def _after_train_step(self) -> None:
        if self.topology is not None:
            self.moe_losses = moe_loss_record(self.engine.module, self.topology)
        if self.objective is not None and self.objective.metric_names:
            self.objective_metrics = self.objective.step_metrics(self.topology)

    def take_metrics(self) -> dict[str, float]:
        """The objective's metrics since the last call (collective; {} without any)."""
        if self.objective is None or not self.objective.metric_names:
            return {}
        return self.objective.summary(self.topology)

    def _with_reference(self, batches):
        """`batches`, or this step's micro-batches with their reference log-probabilities."""
        if self.reference is None:
            return batches
        taken = [next(batches) for _ in range(self.engine.gradient_accumulation_steps())]
        return iter(self.reference.fill(taken))

    def train(self, batches) -> torch.Tensor:
        """Train on one global batch; its loss as a 0-dim tensor on the device."""
        raise NotImplementedError

    def train_step(self, batches) -> float:
        """`train`, its loss read on the host."""
        return float(self.train(batches))

    def eval_step(self, batches) -> float:
        raise NotImplementedError

    def local_loss(self) -> torch.Tensor | None:
        """This rank's summed loss of the current global batch (None where it has none)."""
        raise NotImplementedError

    @property
    def step_applied(self) -> bool:
        """Whether the last train step changed the weights (False: skipped on overflow)."""
        return bool(self.engine.was_step_applied())


class PipelineSteps(EngineSteps):
    """DeepSpeed's `PipelineEngine`.

    The engine sizes its send and receive buffers on the first batch; when a curriculum
    changes the sequence length, every stage drops them (`reset_activation_shape`) before the
    step, as DeepSpeed asks. All stages know the length from the schedule, including the
    ones that read no data."""

    _length: int | None = None  # the sequence length the buffers hold

    def _use_length(self, length: int | None) -> None:
        if length != self._length:
            if self._length is not None:
                self.engine.reset_activation_shape()
            self._length = length

    def train(self, batches) -> torch.Tensor:
        if self.curriculum is not None:
            self._use_length(self.curriculum.length)
        self._before_train_step()
        loss = self.engine.train_batch(data_iter=self._with_reference(batches))
        self._after_train_step()
        return loss.detach().clone()  # DeepSpeed keeps its own

    def eval_step(self, batches) -> float:
        if self.curriculum is not None:
            self._use_length(self.curriculum.seq_length)  # evaluation: the whole samples
        return float(self.engine.eval_batch(data_iter=self._with_reference(batches)))

    def local_loss(self):
        return self.engine.total_loss  # summed over micro-batches on the last stage only


class PlainSteps(EngineSteps):
    """DeepSpeed's ordinary engine over the plain `GPTModel`."""

    def __init__(self, engine, dp_group=None, dp_size: int = 1, topology=None, **objective):
        super().__init__(engine, dp_group, dp_size, topology, **objective)
        self._loss_so_far = torch.zeros((), dtype=torch.float32, device=engine.device)

    def local_loss(self):
        return self._loss_so_far

    def _mean_over_data_parallel(self, total: torch.Tensor, count: int) -> float:
        return float(reduce_host(total / count, self.dp_group)) / self.dp_size

    def _device_mean(self, total: torch.Tensor, count: int) -> torch.Tensor:
        """The same mean, kept on the device (summed in float64, as `reduce_host` sums)."""
        return all_reduce((total / count).double(), self.dp_group) / self.dp_size

    def train(self, batches) -> torch.Tensor:
        engine = self.engine
        # Summed on the device: one copy to the host per step (in the mean), not per micro-batch
        total = self._loss_so_far = torch.zeros((), dtype=torch.float32, device=engine.device)
        steps = engine.gradient_accumulation_steps()
        self._before_train_step()
        batches = self._with_reference(batches)
        for _ in range(steps):
            (tokens, positions), labels = next(batches)
            loss = engine.module.loss_fn(engine(tokens, positions), labels)
            engine.backward(loss)
            total += loss.detach().float()  # before step(): the last one may update
            engine.step()
        self._after_train_step()
        return self._device_mean(total, steps)

    @torch.no_grad()
    def eval_step(self, batches) -> float:
        engine = self.engine
        was_training = engine.module.training
        engine.eval()
        total = torch.zeros((), dtype=torch.float32, device=engine.device)
        steps = engine.gradient_accumulation_steps()
        batches = self._with_reference(batches)
        for _ in range(steps):
            (tokens, positions), labels = next(batches)
            total += engine.module.loss_fn(engine(tokens, positions), labels).float()
        engine.train(was_training)
        return self._mean_over_data_parallel(total, steps)


def engine_steps(engine, topology, objective=None, reference=None, curriculum=None) -> EngineSteps:
    """The step driver that fits `engine` (`objective`, `reference`, `curriculum`: see the
    docstrings)."""
    from deepspeed.runtime.pipe.engine import PipelineEngine

    cls = PipelineSteps if isinstance(engine, PipelineEngine) else PlainSteps
    return cls(
        engine,
        topology.dp_group,
        topology.dp_size,
        topology,
        objective=objective,
        reference=reference,
        curriculum=curriculum,
    )
