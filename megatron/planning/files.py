"""Plan config files as `deepy.py` resolves them: the one path of `deepy.py --dry-run` (and its
warning before a launch) and `tools/plan.py`.

`plan_files(files, overrides, world_size=..., vocab_size=...)` resolves the merged files with
`--set` overrides for that world and the tokenizer's vocabulary, plans the run, and where it
does not fit re-plans each single change of `advice.py` the same way.
"""

from __future__ import annotations

import json

from megatron.config.resolve import load_settings, resolve_settings
from megatron.planning.advice import fitting_changes
from megatron.planning.machine import Machine
from megatron.planning.plan import RunPlan, plan_run


def _as_override(key: str, value) -> str:
    return f"{key}={json.dumps(value)}"  # JSON is YAML: --set reads it typed


def resolve_files(files, overrides, *, world_size: int, vocab_size: int | None):
    """The resolved config of `files` with `--set` `overrides` (no warnings printed)."""
    settings = load_settings(list(files), list(overrides))
    return resolve_settings(settings, world_size=world_size, vocab_size=vocab_size, warn=[],
                            training=True)  # fmt: skip


def plan_files(
    files, overrides=(), *, world_size: int, vocab_size: int | None, machine: Machine | None = None
) -> tuple[RunPlan, list[str]]:
    """The plan of the config and the changes that would make it fit (module docstring)."""
    cfg = resolve_files(files, overrides, world_size=world_size, vocab_size=vocab_size)
    plan = plan_run(cfg, machine)

    def replan(changes: dict) -> RunPlan:
        extra = [_as_override(k, v) for k, v in changes.items()]
        changed = resolve_files(files, [*overrides, *extra], world_size=world_size,
                                vocab_size=vocab_size)  # fmt: skip
        return plan_run(changed, plan.machine)

    return plan, fitting_changes(plan, cfg, replan)
