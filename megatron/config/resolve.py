"""Turn merged settings into the validated, derived, frozen `Config`.

Order: map GPT-NeoX renames and unimplemented keys (warnings), reject unknown keys with a
did-you-mean, check each value against its field's type, build the groups, derive values
(batch arithmetic, data-parallel size, padded vocab, LR iterations, precision), then run the
cross-field validation in `validate.py`.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from pathlib import Path
from typing import Any

from megatron.config.config import GROUPS, KEY_TO_GROUP, Config
from megatron.config.derive import derive
from megatron.config.loader import Setting, apply_overrides, load_files
from megatron.config.neox_keys import DERIVED_IN_NEOX, RENAMED, UNIMPLEMENTED
from megatron.config.schema import ConfigError, coerce, field_types, is_derived
from megatron.config.validate import validate

log = logging.getLogger("megatron.config")


def _did_you_mean(key: str) -> str:
    known = list(KEY_TO_GROUP) + list(RENAMED) + sorted(UNIMPLEMENTED)
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _map_neox_keys(
    settings: dict[str, Setting], warn: list[str]
) -> tuple[dict[str, Setting], dict[str, Any]]:
    """Apply renames; split off accepted-but-unimplemented keys; reject unknown keys."""
    mapped: dict[str, Setting] = {}
    unimplemented: dict[str, Any] = {}
    for key, setting in settings.items():
        if key in RENAMED:
            new, wrap = RENAMED[key]
            if new in settings:
                raise ConfigError(
                    f"config key '{key}' ({setting.source}) is the old name of '{new}', "
                    f"which is also set ({settings[new].source}); keep only '{new}'"
                )
            value = [setting.value] if wrap and isinstance(setting.value, str) else setting.value
            warn.append(f"config key '{key}' ({setting.source}) is now called '{new}'; mapped")
            key, setting = new, Setting(value, setting.source)
        if key in DERIVED_IN_NEOX and (key not in KEY_TO_GROUP or _is_derived_key(key)):
            warn.append(f"config key '{key}' ({setting.source}) is computed, not read; ignored")
        elif key in UNIMPLEMENTED:
            warn.append(
                f"config key '{key}' ({setting.source}) is accepted from GPT-NeoX but not "
                "implemented here; it has no effect"
            )
            unimplemented[key] = setting.value
        elif key not in KEY_TO_GROUP:
            raise ConfigError(f"unknown config key '{key}' in {setting.source}{_did_you_mean(key)}")
        elif _is_derived_key(key):
            raise ConfigError(
                f"config key '{key}' ({setting.source}) is derived from other settings and "
                "cannot be set"
            )
        else:
            mapped[key] = setting
    return mapped, unimplemented


def _is_derived_key(key: str) -> bool:
    return is_derived(GROUPS[KEY_TO_GROUP[key]], key)


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
    mapped, _ = _map_neox_keys(settings, [])
    return _build_groups(mapped)[name]


def load_settings(files: list[str | Path], overrides: list[str] | None = None):
    """Merged settings of config files plus `--set` overrides (not yet validated)."""
    return apply_overrides(load_files([str(f) for f in files]), overrides or [])


def resolve_settings(
    settings: dict[str, Setting],
    *,
    world_size: int | None = None,
    vocab_size: int | None = None,
    warn: list[str] | None = None,
) -> Config:
    """Validate merged settings into a frozen Config; warnings are appended to `warn`."""
    warnings: list[str] = [] if warn is None else warn
    mapped, unimplemented = _map_neox_keys(settings, warnings)
    groups = _build_groups(mapped)
    sources = {k: s.source for k, s in mapped.items()}
    files = tuple(dict.fromkeys(s.source for s in settings.values() if s.source != "--set"))
    cfg = Config(**groups, unimplemented=unimplemented, config_files=files)
    cfg = derive(cfg, sources, world_size=world_size, vocab_size=vocab_size, warn=warnings)
    validate(cfg, sources)
    return cfg


def load_config(
    files: list[str | Path],
    overrides: list[str] | None = None,
    *,
    world_size: int | None = None,
    vocab_size: int | None = None,
    warn: list[str] | None = None,
) -> Config:
    """Load, merge, validate and derive: the one call `deepy.py` and tools make."""
    warnings: list[str] = [] if warn is None else warn
    settings = load_settings(files, overrides)
    cfg = resolve_settings(settings, world_size=world_size, vocab_size=vocab_size, warn=warnings)
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
