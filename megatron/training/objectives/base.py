"""The base of every training objective (`train_impl`), and the sums behind its metrics.

An objective says four things, each in one place:

- what batch it needs: `pairwise` (samples carry `pos`/`neg` halves) and whether it reads
  reference log-probabilities (`needs_reference`, from a frozen reference model run beside the
  policy or from the sample's precomputed `ref` keys);
- how a loader sample becomes model inputs and loss inputs (`model_inputs`): the model gets
  `(tokens, position_ids)`, the loss `loss_inputs`, a tuple of tensors whose first two are
  `(labels, loss_mask)` (DeepSpeed's pipeline engine carries any tuple of tensors to the loss
  on the last stage);
- the loss on the last stage from the logits (`loss`, installed as `model.loss_fn`);
- the metrics it logs: `metric_names`, accumulated as sums and counts (`MetricSums`) over the
  micro-batches of a step and summed over data-parallel ranks, so that a metric is the same
  at every layout.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from megatron.config.groups.model import LOSS_CHUNK_TOKENS_MAX
from megatron.parallel.comm import all_reduce
from megatron.parallel.host_values import collective_device, world_group


class MetricSums:
    """Per-metric (sum, count) over the micro-batches of one step (or one evaluation).

    The sums stay on the loss's device until `reduce`: adding a micro-batch's sums reads
    nothing back (a read per metric per micro-batch would make the host wait for the device
    each time); `reduce` reads them all in one transfer."""

    def __init__(self, names: tuple[str, ...]):
        self.names = tuple(names)
        self.reset()

    def reset(self) -> None:
        self.values: torch.Tensor | None = None  # (sum, count) x metric, float64, on the device

    def add(self, name: str, total, count) -> None:
        """Add a micro-batch's `total` and `count` (numbers or 0-dim tensors) to `name`'s."""
        i = self.names.index(name)
        if self.values is None:
            device = total.device if torch.is_tensor(total) else None
            self.values = torch.zeros(2, len(self.names), dtype=torch.float64, device=device)
        self.values[0, i] += total
        self.values[1, i] += count

    def _world_sums(self, topology) -> torch.Tensor:
        """The (sum, count) x metric sums over every sample of the step, on the device.

        Collective over the whole world when `topology` spans more than one rank: only the
        ranks that compute the loss (last pipeline stage, tensor-parallel rank 0) contribute,
        so each sample counts once."""
        values = self.values
        if values is None:
            values = torch.zeros(2, len(self.names), dtype=torch.float64)
        self.reset()
        if topology is None or topology.world_size == 1:
            return values
        group = world_group()
        values = values.to(collective_device(group))
        if not (topology.is_last_stage and topology.tp_rank == 0):
            values = torch.zeros_like(values)
        return all_reduce(values, group)

    def reduce(self, topology=None) -> dict[str, float]:
        """The metrics as means over every sample of the step, equal on every rank (collective,
        see `_world_sums`); read in one transfer."""
        sums, counts = self._world_sums(topology).tolist()
        return {name: sums[i] / counts[i] for i, name in enumerate(self.names) if counts[i] > 0}

    def step_means(self, topology=None) -> dict[str, torch.Tensor]:
        """`reduce` kept on the device, for a train step's log: each metric as a `(mean,
        present)` float64 pair, `(0, 0)` where the step had no sample for it (the log interval
        sums the pairs: `monitor.py`)."""
        sums, counts = self._world_sums(topology)  # (metrics,) each
        present = counts > 0
        means = torch.where(present, sums / counts, 0.0)
        pairs = torch.stack([means, present.double()], dim=1)  # (metrics, 2)
        return dict(zip(self.names, pairs.unbind(0)))


class Objective:
    """One `train_impl`; subclasses fill in the class attributes and the two methods."""

    name: ClassVar[str]
    pairwise: ClassVar[bool] = False
    metric_names: ClassVar[tuple[str, ...]] = ()
    language_model: ClassVar[bool] = False
    """Whether the loss is next-token cross entropy (only then is exp(loss) a perplexity)."""

    def __init__(self, cfg, tp_group=None):
        self.cfg = cfg
        self.tp_group = tp_group
        # The true vocabulary: logit columns from it on are padding, masked out of the loss.
        self.vocab_size = getattr(getattr(cfg, "model", None), "true_vocab_size", None)
        # Tokens per chunk where the model hands over the head's inputs (`loss_chunk_tokens`).
        chunk = getattr(getattr(cfg, "model", None), "loss_chunk_tokens", 0)
        self.chunk_tokens = chunk or LOSS_CHUNK_TOKENS_MAX
        self.metrics = MetricSums(self.metric_names)

    @property
    def needs_reference(self) -> bool:
        """Whether the loss reads reference log-probabilities from a reference model."""
        return False

    def install(self, model: torch.nn.Module) -> None:
        """Make `model.loss_fn` this objective's loss (the engines call `module.loss_fn`)."""
        model.loss_fn = self.loss

    def summary(self, topology=None) -> dict[str, float]:
        """The metrics since the last summary (collective, see `MetricSums.reduce`)."""
        return self.metrics.reduce(topology)

    def step_metrics(self, topology=None) -> dict[str, torch.Tensor]:
        """`summary` of a train step left on the device (`MetricSums.step_means`)."""
        return self.metrics.step_means(topology)

    def model_inputs(self, sample: dict, settings):
        """`((tokens, position_ids), loss_inputs)` for one micro-batch of loader samples."""
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, loss_inputs) -> torch.Tensor:
        """fp32 scalar loss of one micro-batch from this rank's `(b, s, V/tp)` logits."""
        raise NotImplementedError
