"""Worker entry point, started by `deepy.py` on every rank: decode the config bundle, evaluate.

    python deepy.py eval.py configs/small.yml local.yml --set 'eval_tasks=[lambada_openai]'

Runs the lm-eval harness tasks of `eval_tasks` on the checkpoint in `load` (any
tensor/pipeline layout); results go to `{eval_results_prefix}_eval_results.json`.
"""

from megatron.config import config_from_argv
from megatron.config.verbosity import setup_worker_logging
from megatron.errors import run_worker


def main(argv: list[str] | None = None) -> None:
    setup_worker_logging(argv)
    cfg = config_from_argv(argv)
    from megatron.evaluation import evaluate_from_config

    evaluate_from_config(cfg)


if __name__ == "__main__":
    run_worker(main)
