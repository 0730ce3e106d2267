"""`eval.py`'s work: load the model at the run's layout and run lm-eval tasks through it.

    evaluate_from_config(cfg)       # on every rank; eval.py calls it

`eval_tasks` lists lm-eval task (or group) names. An entry that is an existing folder is not a
task but a place to look for task YAML files (lm-eval's `include_path`), e.g.
`[tests/data/lm_eval_task, tiny_mc]` for a local task. Results (lm-eval's `results` and
`n-samples`, plus the layout) go to `{eval_results_prefix}_eval_results.json` (or
`eval_results.json` without a prefix), each scored document (its task, id, target and
filtered responses) to `..._eval_samples.jsonl` beside it, written by rank 0, and lm-eval's
table is printed.
Tasks whose data lm-eval would download need the network (or the Hugging Face datasets cache);
local tasks load their files with `datasets` offline (`HF_DATASETS_OFFLINE=1`). The tasks are
loaded before the model: an unknown name, or data that cannot be reached, stops the run with
one line naming the task (`EvalTaskError`) and the offline way.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def split_tasks(entries) -> tuple[list[str], list[str]]:
    """`(task names, include folders)` from the `eval_tasks` entries."""
    tasks, folders = [], []
    for entry in entries or ():
        (folders if Path(entry).is_dir() else tasks).append(str(entry))
    if not tasks:
        raise ValueError(
            f"eval_tasks {list(entries or [])} names no lm-eval task; give task names "
            "(folders in the list only add places to find task YAML files)"
        )
    return tasks, folders


def results_path(prefix: str, kind: str = "results.json") -> Path:
    """`{prefix}_eval_{kind}`, or `eval_{kind}` without a prefix."""
    return Path(f"{prefix}_eval_{kind}" if prefix else f"eval_{kind}")


def sample_lines(results: dict) -> list[str]:
    """One JSON line per scored document: task, doc_id, target, filtered responses."""
    lines = []
    for task, samples in (results.get("samples") or {}).items():
        for sample in samples:
            record = {
                "task": task,
                "doc_id": sample.get("doc_id"),
                "target": sample.get("target"),
                "filtered_resps": sample.get("filtered_resps"),
            }
            lines.append(json.dumps(record, default=str))
    return lines


class EvalTaskError(ValueError):
    """An `eval_tasks` entry lm-eval does not know, or whose data cannot be loaded."""


OFFLINE_HINT = (
    "without network, evaluate a task whose data is local (a folder of lm-eval task YAML files "
    "in eval_tasks, such as configs/lm_eval with shakespeare_lastword), or fill the Hugging Face "
    "datasets cache where there is network and run with HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1"
)


def task_manager(tasks: list[str], folders: list[str]):
    """lm-eval's `TaskManager` with `tasks` loaded now, before the model, so an unknown name
    or data that cannot be reached stops the run in one line (`EvalTaskError`); its `load`
    of the same tasks inside `simple_evaluate` returns what was loaded here."""
    import difflib

    from lm_eval.tasks import TaskManager

    class LoadedOnce(TaskManager):
        def load(self, task_list):
            key = json.dumps(task_list, default=str)
            if key not in self.loaded:
                self.loaded[key] = super().load(task_list)
            return self.loaded[key]

    manager = LoadedOnce(include_path=folders or None)
    manager.loaded = {}
    unknown = [t for t in tasks if t not in manager.all_tasks and not Path(t).is_file()]
    if unknown:
        close = difflib.get_close_matches(unknown[0], manager.all_tasks, n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        where = f" (with the task files of {', '.join(folders)})" if folders else ""
        raise EvalTaskError(
            f"eval_tasks: {', '.join(unknown)} is not an lm-eval task, group or tag{where}{hint}"
        )
    try:
        manager.load(tasks)
    except OSError as err:  # ConnectionError, a missing data file, a dataset not cached
        raise EvalTaskError(
            f"eval_tasks: the data of {', '.join(tasks)} could not be loaded ({err}); "
            + OFFLINE_HINT
        ) from err
    return manager


def run_tasks(model, tokenizer, manager, tasks: list[str], **kwargs) -> dict | None:
    """lm-eval's `simple_evaluate` with our model (collective: call it on every rank). The
    results come back where LOCAL_RANK is 0 (lm-eval returns None elsewhere)."""
    from lm_eval import simple_evaluate

    from megatron.evaluation.adapter import MegatronLM

    lm = MegatronLM(model, tokenizer)
    return simple_evaluate(model=lm, tasks=tasks, task_manager=manager, log_samples=True, **kwargs)


def evaluate_from_config(cfg) -> dict | None:
    """Set up, evaluate `cfg.generation.eval_tasks`, write the results on rank 0; return the
    summary (None on ranks where lm-eval returns no results)."""
    from megatron.data import build_tokenizer
    from megatron.inference import InferenceModel
    from megatron.launcher.worker import initialize_distributed
    from megatron.parallel.random import seed_everything

    tasks, folders = split_tasks(cfg.generation.eval_tasks)
    manager = task_manager(tasks, folders)
    topology = initialize_distributed(cfg)
    seed_everything(cfg.training.seed)
    tokenizer = build_tokenizer(cfg)
    model = InferenceModel.from_config(cfg, topology, vocab_size=tokenizer.vocab_size)
    results = run_tasks(model, tokenizer, manager, tasks, random_seed=cfg.training.seed)
    if results is None:
        return None
    summary = {
        "results": results["results"],
        "n-samples": results.get("n-samples"),
        "tasks": tasks,
        "model_parallel_size": topology.tp_size,
        "pipe_parallel_size": topology.pp_size,
        "checkpoint": cfg.checkpointing.load,
    }
    if topology.rank == 0:
        from lm_eval.utils import make_table

        path = results_path(cfg.generation.eval_results_prefix)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2, default=str))
        samples = results_path(cfg.generation.eval_results_prefix, "samples.jsonl")
        samples.write_text("".join(line + "\n" for line in sample_lines(results)))
        print(make_table(results))
        log.info("wrote %s and %s", path, samples)
    return summary
