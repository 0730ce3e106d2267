"""Training objectives, one module each, keyed by `train_impl` (see `base.Objective`).

To add one: a module here with an `Objective` subclass, and its entry in `OBJECTIVES`.
"""

from __future__ import annotations

from megatron.training.objectives.base import MetricSums, Objective
from megatron.training.objectives.dpo import DPO
from megatron.training.objectives.kto import KTO
from megatron.training.objectives.lm import LanguageModel
from megatron.training.objectives.rm import RewardModel

OBJECTIVES: dict[str, type[Objective]] = {
    "normal": LanguageModel,
    "dpo": DPO,
    "kto": KTO,
    "rm": RewardModel,
}


def build_objective(cfg, tp_group=None) -> Objective:
    """The objective `cfg`'s `train_impl` names (`normal` when the key is absent)."""
    post = getattr(cfg, "post_training", None)
    name = getattr(post, "train_impl", "normal")
    if name not in OBJECTIVES:
        raise ValueError(f"train_impl: {name!r} is not built; valid: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name](cfg, tp_group)


__all__ = ["OBJECTIVES", "MetricSums", "Objective", "build_objective"]
