"""Turn merged settings into the validated, derived, frozen `Config`.

Order: map GPT-NeoX renames, sort out GPT-NeoX keys we do not implement (accepted, warned
about or refused by `neox/policy.py`), reject unknown keys with a did-you-mean, check each
value against its field's type, build the groups, derive values (batch arithmetic,
data-parallel size, padded vocab, LR iterations, precision, GPT-NeoX's optimizer default),
then run the cross-field validation in `validate.py`. `training=False` (generate.py, eval.py)
resolves a config that only describes a model and a checkpoint: no batch sizes needed.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from megatron.config.checks.device_syncs import warn_device_syncs
from megatron.config.checks.validate import validate
from megatron.config.config import GROUPS, KEY_TO_GROUP, Config
from megatron.config.derive import derive
from megatron.config.loader import Setting, apply_overrides, load_files
from megatron.config.neox.policy import (
    check_computed_keys,
    check_neox_keys,
    check_refused_values,
    map_neox_keys,
)
from megatron.config.schema import coerce, field_types

log = logging.getLogger("megatron.config")


def _build_groups(settings: dict[str, Setting]) -> dict[str, Any]:
    values: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    for key, setting in settings.items():
        group = KEY_TO_GROUP[key]
        annotation = field_types(GROUPS[group])[key]
        values[group][key] = coerce(key, setting.value, annotation, setting.source)
    return {g: GROUPS[g](**kv) for g, kv in values.items()}


def settings_group(settings: dict[str, Setting], name: str) -> Any:
    """One group (e.g. `launcher`, `tokenizer`) built from merged settings, before the rest is
    resolved: what the launcher needs to know the world size the full resolution depends on."""
    ours, _, _ = map_neox_keys(settings, [])
    return _build_groups(ours)[name]


def load_settings(files: list[str | Path], overrides: list[str] | None = None):
    """Merged settings of config files plus `--set` overrides (not yet validated)."""
    return apply_overrides(load_files([str(f) for f in files]), overrides or [])


# Worker scripts that only run a trained model: their configs need no training keys.
INFERENCE_SCRIPTS = ("generate.py", "eval.py")


def is_training_script(script: str | Path) -> bool:
    """Whether `script` trains (needs batch sizes and an optimizer) or only runs a model."""
    return Path(script).name not in INFERENCE_SCRIPTS


def resolve_settings(
    settings: dict[str, Setting],
    *,
    world_size: int | None = None,
    vocab_size: int | None = None,
    warn: list[str] | None = None,
    training: bool = True,
) -> Config:
    """Validate merged settings into a frozen Config; warnings are appended to `warn`."""
    warnings: list[str] = [] if warn is None else warn
    ours, neox, computed = map_neox_keys(settings, warnings)
    given = {k: s.value for k, s in {**ours, **neox}.items()}
    accepted, implied = check_neox_keys(neox, given, warnings)
    ours.update(implied)
    groups = _build_groups(ours)
    sources = {k: s.source for k, s in ours.items()}
    files = tuple(dict.fromkeys(s.source for s in settings.values() if s.source != "--set"))
    cfg = Config(**groups, unimplemented=accepted, config_files=files)
    cfg = derive(
        cfg,
        sources,
        world_size=world_size,
        vocab_size=vocab_size,
        warn=warnings,
        training=training,
    )
    check_computed_keys(cfg, computed, warnings)
    check_refused_values(cfg, sources)
    validate(cfg, sources)
    warn_device_syncs(cfg, sources, warnings)
    return cfg


def load_config(
    files: list[str | Path],
    overrides: list[str] | None = None,
    *,
    world_size: int | None = None,
    vocab_size: int | None = None,
    warn: list[str] | None = None,
    training: bool = True,
) -> Config:
    """Load, merge, validate and derive: the one call `deepy.py` and tools make."""
    warnings: list[str] = [] if warn is None else warn
    settings = load_settings(files, overrides)
    cfg = resolve_settings(
        settings, world_size=world_size, vocab_size=vocab_size, warn=warnings, training=training
    )
    if warn is None:
        log_warnings(warnings)
    return cfg


def log_warnings(lines: list[str]) -> None:
    for line in lines:
        log.warning(line)


def config_from_dict(flat: dict[str, Any], **kwargs: Any) -> Config:
    """Resolve a flat `{key: value}` mapping as if it came from one file (used by tests/tools)."""
    return resolve_settings({k: Setting(v, "<dict>") for k, v in flat.items()}, **kwargs)


def field_names() -> list[str]:
    return [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
