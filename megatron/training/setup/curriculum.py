"""Sequence-length curriculum: GPT-NeoX's `curriculum_learning` section with
`curriculum_type: seqlen`.

The length of each step's sequences comes from DeepSpeed's `CurriculumScheduler`, asked with
`iteration + 1` as GPT-NeoX does (DeepSpeed counts steps from 1). GPT-NeoX runs DeeperSpeed's
copy of that scheduler, which differs in one corner, and we follow DeepSpeed 0.19's: with a
`min_difficulty` that is not a multiple of `difficulty_step`, a length floored to a multiple
is raised to the first multiple at or above `min_difficulty`, where DeeperSpeed leaves it
below (at 0, an empty sequence, when `min_difficulty < difficulty_step`).
Every micro-batch of that step keeps the first `length` tokens of its samples (tokens,
positions, labels, loss mask) and drops the rest, as GPT-NeoX's `get_batch_pipe` does; the data
position still advances by whole samples. Evaluation runs at the full `seq_length`.

The scheduler holds one piece of state, the current difficulty (it stops asking the schedule
once that reaches `max_difficulty`), which the checkpoint carries so a resumed run takes the
lengths the unbroken run took. The config checks are `megatron/config/checks/curriculum.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

_CURRENT = "current_difficulty"  # DeepSpeed's name for the scheduler's state


class SeqlenCurriculum:
    """The sequence length of each training step, and what such a step computes."""

    def __init__(self, section: dict, seq_length: int, work_of: Callable[[int], object]):
        from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler

        self.scheduler = CurriculumScheduler(section)
        self.seq_length = seq_length
        self._work_of = work_of
        self._works: dict[int, object] = {}
        self.length = seq_length

    @classmethod
    def from_config(cls, cfg, work_of: Callable[[int], object]) -> SeqlenCurriculum | None:
        """The curriculum `cfg` enables, or None. `work_of(length)`: a step's `StepWork`."""
        section = cfg.deepspeed.curriculum_learning
        if not section or not section.get("enabled", False):
            return None
        return cls(section, cfg.model.seq_length, work_of)

    def begin_step(self, iteration: int) -> int:
        """The length of the step that follows `iteration` completed steps."""
        self.length = min(self.scheduler.update_difficulty(iteration + 1), self.seq_length)
        return self.length

    @property
    def work(self):
        """The current step's tokens and FLOPs (`flops.StepWork`) at its real length."""
        if self.length not in self._works:
            self._works[self.length] = self._work_of(self.length)
        return self._works[self.length]

    def state_dict(self) -> dict:
        return {_CURRENT: int(self.scheduler.state[_CURRENT])}

    def resume(self, iteration: int, state: dict | None) -> None:
        """Continue after `iteration` steps: from the checkpoint's state, or (a checkpoint of a
        run without the curriculum) from the schedule at that step, as GPT-NeoX resumes."""
        if state is not None:
            self.scheduler.state[_CURRENT] = state[_CURRENT]
        elif iteration > 0:
            self.scheduler.update_difficulty(iteration)

    def truncated(self, batches: Iterator) -> Iterator:
        """`batches` (model inputs, `setup/batches.py`) cut to the current step's length."""
        for (tokens, positions), (labels, loss_mask) in batches:
            n = self.length
            if n < tokens.shape[1]:
                tokens, positions, labels, loss_mask = (
                    t[:, :n].contiguous() for t in (tokens, positions, labels, loss_mask)
                )
            yield (tokens, positions), (labels, loss_mask)
