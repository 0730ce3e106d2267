"""When to save a checkpoint, of which kind, and which temporary checkpoint to retire.

Three kinds of checkpoint (Levanter's two policies beside GPT-NeoX's schedule):

- permanent: at the iterations of the `checkpoint_keep` tiers (Levanter's `keep`): every
  `every` iterations while the iteration is at most the tier's `until` (inclusive; the first
  tier whose `until` has not passed applies, a tier without `until` applies forever). Saved as
  `global_step{N}/` with a `permanent` marker; nothing deletes it.
- step: GPT-NeoX's schedule (`checkpoint_factor` linear or log, `extra_save_iters`, the last
  iteration) and the save when a run stops early. Saved as `global_step{N}/`; pruned by
  `keep_last_n_checkpoints`, which counts only these.
- temporary: when `checkpoint_save_interval_minutes` (Levanter's `save_interval`) have passed
  since the last save of any kind completed (or since training started), at an iteration no
  other rule picks. Saved as
  `global_step{N}_temporary/`. Once the next checkpoint of any kind is complete (and `latest`
  names it), every other temporary folder under `save` is deleted, so at most one survives.

An iteration that several rules pick is saved once, as the first kind of that list: a tier step
that is also a `checkpoint_factor` step is permanent. Whether the interval has passed is
decided by global rank 0's clock and shared, since saving is collective: every rank saves
at the same iteration even when their clocks or step times differ. `latest` always names the
newest complete checkpoint (written last by `CheckpointIO.save`).

Sharing rank 0's answer costs nothing of its own in training: the policy rides on the step's
one all-reduce and read (`StopRequest.ride`, carried by the non-finite step check), rank 0
giving its answer, every other rank False, so the MAX is rank 0's. Rank 0 then looks at its
clock during the step's optimizer boundary rather than after the step. Where no check carried
the answer this iteration, `decide` broadcasts it (one collective and one read).
"""

from __future__ import annotations

import logging
import math
import shutil
from time import monotonic

import torch.distributed as dist

from megatron.checkpoint.folders import temporary_checkpoints
from megatron.config.groups.checkpointing import CheckpointTier, parse_checkpoint_keep
from megatron.parallel.host_values import broadcast_host, world_group

log = logging.getLogger(__name__)


def tier_every(tiers: tuple[CheckpointTier, ...], iteration: int) -> int | None:
    """The `every` of the tier that applies at `iteration` (None when every tier has ended)."""
    for tier in tiers:
        if tier.until is None or iteration <= tier.until:
            return tier.every
    return None


class SaveSchedule:
    """Whether to save after an iteration: every `checkpoint_factor` iterations (`linear`) or
    at its powers 1, f, f², ... (`log`), at `extra_save_iters`, and at `train_iters`."""

    def __init__(
        self,
        factor: int | None,
        scale: str = "linear",
        extra_iters=None,
        train_iters: int | None = None,
    ):
        if scale not in ("linear", "log"):
            raise ValueError(f"checkpoint_scale '{scale}' is not valid; expected linear or log")
        if factor is not None and (factor < 1 or (scale == "log" and factor < 2)):
            raise ValueError(
                f"checkpoint_factor {factor} is not valid for checkpoint_scale '{scale}'; "
                "use >= 1 (linear) or >= 2 (log)"
            )
        self.factor, self.scale = factor, scale
        self.extra = set(extra_iters or ())
        self.train_iters = train_iters

    def should_save(self, iteration: int) -> bool:
        if iteration in self.extra or iteration == self.train_iters:
            return True
        if not self.factor or iteration < 1:
            return False
        if self.scale == "linear":
            return iteration % self.factor == 0
        power = round(math.log(iteration, self.factor))
        return self.factor**power == iteration

    @classmethod
    def from_config(cls, cfg, train_iters: int | None) -> SaveSchedule:
        c = cfg.checkpointing
        return cls(c.checkpoint_factor, c.checkpoint_scale, c.extra_save_iters, train_iters)


class CheckpointPolicy:
    """Which kind of checkpoint (if any) to save after an iteration.

    `clock` gives seconds (default `time.monotonic`; injectable for tests). The interval is
    measured from the policy's creation (the start of training) and from the completion of
    every save of any kind (`saved`).
    """

    def __init__(
        self,
        schedule: SaveSchedule,
        tiers=(),
        interval_minutes: float | None = None,
        clock=None,
    ):
        self.schedule = schedule
        self.tiers = tuple(tiers)
        self.interval = None if interval_minutes is None else 60.0 * interval_minutes
        self.clock = clock or monotonic  # looked up here, so that a test can replace it
        self.last_save = self.clock()
        self._carried: bool | None = None  # rank 0's answer, agreed by this step's check

    @classmethod
    def from_config(cls, cfg, train_iters: int | None, clock=None) -> CheckpointPolicy:
        c = cfg.checkpointing
        tiers = parse_checkpoint_keep(c.checkpoint_keep)
        schedule = SaveSchedule.from_config(cfg, train_iters)
        return cls(schedule, tiers, c.checkpoint_save_interval_minutes, clock)

    def is_permanent(self, iteration: int) -> bool:
        every = tier_every(self.tiers, iteration)
        return every is not None and iteration >= 1 and iteration % every == 0

    def interval_passed(self) -> bool:
        """This process's view; `decide` shares global rank 0's with every rank."""
        return self.interval is not None and self.clock() - self.last_save >= self.interval

    def local(self) -> bool:
        """This rank's share of a MAX all-reduce that yields rank 0's view (`StopRequest.ride`):
        rank 0's own, False elsewhere."""
        return _global_rank() == 0 and self.interval_passed()

    def carried(self, agreed: bool) -> None:
        """Rank 0's view, agreed by a collective that every rank ran this step."""
        self._carried = agreed

    def decide(self, iteration: int) -> str | None:
        """The kind to save after `iteration` (see the module docstring), or None. Collective
        when distributed with an interval set, the iteration no scheduled save and no answer
        carried this step: every rank must call it after every iteration."""
        carried, self._carried = self._carried, None  # never seen by a later iteration
        if self.is_permanent(iteration):
            return "permanent"
        if self.schedule.should_save(iteration):
            return "step"
        return "temporary" if self._time_due(carried) else None

    def _time_due(self, carried: bool | None) -> bool:
        if self.interval is None:
            return False
        if carried is not None:
            return carried
        # rank 0's clock decides for all
        return bool(broadcast_host([self.interval_passed()], 0, world_group())[0])

    def saved(self) -> None:
        """A checkpoint of any kind is complete: the interval starts again."""
        self.last_save = self.clock()


def _global_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def retire_temporaries(save_dir, keep_tag: str) -> list:
    """Delete every temporary checkpoint folder under `save_dir` but `keep_tag` (the checkpoint
    just completed, which `latest` names). Rank 0 only, after the save's last barrier. Returns
    the folders deleted; one that cannot be deleted is reported, naming it and the error."""
    deleted = []
    for _, path in temporary_checkpoints(save_dir):
        if path.name == keep_tag:
            continue
        try:
            shutil.rmtree(path)
        except OSError as err:
            log.warning(
                "could not delete the previous temporary checkpoint %s (%s); delete it by hand",
                path,
                err,
            )
        else:
            deleted.append(path)
    return deleted
