"""Evaluation: mean loss and perplexity over `eval_iters` global batches of a split.

The perplexity is exp(loss) of the language-model objective only; a DPO, KTO or reward-model
loss is no cross entropy, so its evaluations report no perplexity (None, left out of the
record) but the objective's own metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_EXP = 700.0  # exp() of more overflows a float; such a perplexity is reported as exp(700)


@dataclass(frozen=True)
class EvalResult:
    loss: float
    perplexity: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    """The objective's metrics over the evaluation (DPO's rewards, margins, accuracy, ...)."""

    def record(self, iteration: int, split: str) -> dict:
        """The evaluation record the loggers take."""
        record = {"iteration": iteration, "split": split, "loss": self.loss}
        if self.perplexity is not None:
            record["perplexity"] = self.perplexity
        return {**record, **self.metrics}


def evaluate(steps, batches, eval_iters: int) -> EvalResult:
    """Average loss of `eval_iters` evaluation steps (each a global batch) from `batches`."""
    if eval_iters < 1:
        raise ValueError(f"eval_iters must be >= 1 to evaluate, got {eval_iters}")
    losses = [steps.eval_step(batches) for _ in range(eval_iters)]
    loss = sum(losses) / len(losses)
    metrics = steps.take_metrics() if hasattr(steps, "take_metrics") else {}
    objective = getattr(steps, "objective", None)
    lm = objective is None or objective.language_model
    return EvalResult(loss, math.exp(min(loss, MAX_EXP)) if lm else None, metrics)


class Evaluator:
    """Evaluates the validation split every `interval` iterations, and any split once at the
    end. Each evaluation continues through the validation iterator (new samples each time),
    unless `restart` is given: then every evaluation after the first reads a fresh iterator
    from it (`eval_fixed_samples`: the same samples each time)."""

    def __init__(self, steps, valid_batches, interval: int, eval_iters: int, loggers, restart=None):
        self.steps = steps
        self.valid = valid_batches
        self.interval = interval
        self.eval_iters = eval_iters
        self.loggers = loggers
        self.restart = restart
        self.last: EvalResult | None = None

    def due(self, iteration: int) -> bool:
        return bool(self.valid is not None and self.interval and iteration % self.interval == 0)

    def run(self, iteration: int, split: str = "valid", batches=...) -> EvalResult | None:
        """Evaluate `batches` (default: the validation iterator); None when there is no data."""
        if batches is ...:
            if self.restart is not None and self.last is not None:
                self.valid = self.restart()
            batches = self.valid
        if batches is None or self.eval_iters < 1:
            return None
        result = evaluate(self.steps, batches, self.eval_iters)
        self.loggers.log_eval(result.record(iteration, split))
        if split == "valid":
            self.last = result
        return result
