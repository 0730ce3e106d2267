"""Evaluation with the lm-eval harness (pinned 0.4.x): our model behind lm-eval's LM API.

| module    | what it holds                                                          |
| --------- | ---------------------------------------------------------------------- |
| `adapter` | `MegatronLM`: loglikelihood, rolling loglikelihood, generate_until     |
| `run`     | `evaluate_from_config(cfg)` (eval.py), `run_tasks`, task-folder entries |

`lm_eval` is imported only here (the `eval` extra of the requirements).
"""

from megatron.evaluation.run import (
    evaluate_from_config,
    results_path,
    run_tasks,
    sample_lines,
    split_tasks,
)

__all__ = ["evaluate_from_config", "results_path", "run_tasks", "sample_lines", "split_tasks"]
