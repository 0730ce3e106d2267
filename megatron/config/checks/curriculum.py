"""Checks of GPT-NeoX's `curriculum_learning` section (the sequence-length curriculum,
`megatron/training/setup/curriculum.py`): DeepSpeed's scheduler would stop on an `assert`, and
a length it could produce that the model cannot take would stop a worker mid-run."""

from __future__ import annotations

from megatron.config.config import Config
from megatron.config.schema import ConfigError
from megatron.config.schema import set_in as _src

# schedule_type -> the schedule_config keys it needs (DeepSpeed's CurriculumScheduler)
SCHEDULES = {
    "fixed_linear": ("total_curriculum_step", "difficulty_step"),
    "fixed_root": ("total_curriculum_step", "difficulty_step", "root_degree"),
    "fixed_discrete": ("difficulty", "max_step"),
}


def validate_curriculum(cfg: Config, sources: dict[str, str]) -> None:
    section = cfg.deepspeed.curriculum_learning
    if not section or not section.get("enabled", False):
        return
    where = f"curriculum_learning{_src(sources, 'curriculum_learning')}"

    def refuse(problem: str) -> None:
        raise ConfigError(f"{where}: {problem}")

    if section.get("curriculum_type", "seqlen") != "seqlen":
        refuse(f"curriculum_type {section['curriculum_type']!r} is not built; only 'seqlen' is")
    kind = section.get("schedule_type")
    if kind not in SCHEDULES:
        refuse(
            f"schedule_type {kind!r} is not one of {', '.join(SCHEDULES)} ('custom' needs a "
            "Python schedule function, which a config cannot give)"
        )
    schedule = section.get("schedule_config") or {}
    missing = [k for k in SCHEDULES[kind] if k not in schedule]
    if missing:
        refuse(f"schedule_type {kind} needs schedule_config keys {', '.join(missing)}")
    low, high = section.get("min_difficulty"), section.get("max_difficulty")
    seq = cfg.model.seq_length
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high <= seq):
        refuse(
            f"min_difficulty {low} and max_difficulty {high} must be integers with "
            f"1 <= min_difficulty <= max_difficulty <= seq_length ({seq})"
        )
    lengths = list(schedule["difficulty"]) if kind == "fixed_discrete" else [low]
    if kind == "fixed_discrete" and len(lengths) != len(schedule["max_step"]) + 1:
        refuse("schedule_config.difficulty needs exactly one more entry than max_step")
    if any(not isinstance(n, int) or n < 1 for n in lengths):
        refuse(f"every length of the schedule must be a positive integer, not {lengths}")
    if cfg.post_training.train_impl != "normal":
        refuse(
            f"train_impl {cfg.post_training.train_impl} cannot shorten its sequences (GPT-NeoX "
            "builds the curriculum for train_impl: normal only); remove curriculum_learning"
        )
    tp = cfg.parallel.model_parallel_size
    step = schedule.get("difficulty_step", 1)
    if cfg.parallel.sequence_parallel and tp > 1:
        # every length must split evenly across the tensor-parallel ranks
        if kind == "fixed_discrete" and any(n % tp for n in lengths):
            refuse(f"with sequence_parallel every difficulty must be a multiple of {tp} (tp)")
        if kind != "fixed_discrete" and (step % tp or high % tp):
            refuse(
                f"with sequence_parallel difficulty_step and max_difficulty must be multiples "
                f"of {tp} (tp)"
            )
