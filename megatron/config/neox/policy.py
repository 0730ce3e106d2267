"""Apply the classification of `neox_keys.py` to the settings of one run.

`map_neox_keys` sorts merged settings into our keys (renames applied), GPT-NeoX keys we do
not implement, and keys GPT-NeoX computes itself; unknown keys are refused with a did-you-mean.
`check_neox_keys` then accepts, warns about or refuses each of those keys (or, for the few
GPT-NeoX switches we express with our own keys, sets those), and
`check_refused_values`/`check_derived_agree` do the same for schema values nothing builds and
for computed keys that contradict the keys they are computed from. Every refusal of a run is
collected and raised as one `ConfigError`, so a user fixes them in one pass.
"""

from __future__ import annotations

from typing import Any

from megatron.config.config import GROUPS, KEY_TO_GROUP, Config
from megatron.config.loader import Setting
from megatron.config.neox.keys import (
    DERIVED_IN_NEOX,
    DERIVED_MUST_AGREE,
    GATES,
    IMPLEMENTED,
    NEOX_KEYS,
    NO_EFFECT,
    REFUSED_VALUES,
    RENAMED,
    NeoxKey,
)
from megatron.config.other_names import did_you_mean
from megatron.config.schema import ConfigError, is_derived


def _did_you_mean(key: str) -> str:
    return did_you_mean(key, list(KEY_TO_GROUP) + list(RENAMED) + sorted(NEOX_KEYS))


def _is_derived_key(key: str) -> bool:
    return is_derived(GROUPS[KEY_TO_GROUP[key]], key)


def _rename(key: str, setting: Setting, settings: dict[str, Setting], warn: list[str]):
    new, wrap = RENAMED[key]
    if new in settings:
        raise ConfigError(
            f"config key '{key}' ({setting.source}) is the old name of '{new}', "
            f"which is also set ({settings[new].source}); keep only '{new}'"
        )
    value = [setting.value] if wrap and isinstance(setting.value, str) else setting.value
    warn.append(f"config key '{key}' ({setting.source}) is now called '{new}'; mapped")
    return new, Setting(value, setting.source)


def map_neox_keys(settings: dict[str, Setting], warn: list[str]):
    """`(ours, neox, computed)`: our keys, unimplemented GPT-NeoX keys, GPT-NeoX-computed keys
    (each `{key: Setting}`); renames are applied, unknown keys and our derived keys refused."""
    ours: dict[str, Setting] = {}
    neox: dict[str, Setting] = {}
    computed: dict[str, Setting] = {}
    for key, setting in settings.items():
        if key in RENAMED:
            key, setting = _rename(key, setting, settings, warn)
        if key in DERIVED_IN_NEOX and (key not in KEY_TO_GROUP or _is_derived_key(key)):
            computed[key] = setting
        elif key in NEOX_KEYS:
            neox[key] = setting
        elif key not in KEY_TO_GROUP:
            raise ConfigError(f"unknown config key '{key}' in {setting.source}{_did_you_mean(key)}")
        elif _is_derived_key(key):
            raise ConfigError(
                f"config key '{key}' ({setting.source}) is derived from other settings and "
                "cannot be set"
            )
        else:
            ours[key] = setting
    return ours, neox, computed


def _number(value: Any) -> Any:
    # YAML 1.1 reads `1e-8` (no dot) as text; compare it as the number it means.
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _is_default(spec: NeoxKey, value: Any) -> bool:
    value = _number(value)
    return any(value == d and isinstance(value, bool) == isinstance(d, bool) for d in spec.defaults)


def _gate_active(spec: NeoxKey, values: dict[str, Any]) -> bool:
    if spec.gate is None:
        return True
    gate = GATES[spec.gate]
    return any(gate.active(values.get(k)) for k in gate.keys)


def _refusal(key: str, setting: Setting, spec: NeoxKey) -> str:
    status = " (planned, not built yet)" if spec.issue else ""
    return (
        f"config key '{key}' ({setting.source}) is {setting.value!r}: {spec.advice}{status}; "
        f"the run would not do what the config says, so it is refused: remove the key or set it "
        f"to GPT-NeoX's default {spec.defaults[0]!r}"
    )


def check_neox_keys(neox: dict[str, Setting], values: dict[str, Any], warn: list[str]):
    """Accept, warn about or refuse each GPT-NeoX key of `NEOX_KEYS`; `values` holds every
    key's given value (for gates and implications). Returns the accepted `{key: value}` and
    the settings of our keys that implemented ones imply (`{key: Setting}`)."""
    refused: list[str] = []
    accepted: dict[str, Any] = {}
    implied: dict[str, Setting] = {}
    for key, setting in neox.items():
        spec = NEOX_KEYS[key]
        if spec.kind == IMPLEMENTED:
            accepted[key] = setting.value
            for ours, value in spec.implies(setting.value, values).items():
                implied[ours] = Setting(value, setting.source)
        elif _is_default(spec, setting.value):
            accepted[key] = setting.value
        elif spec.kind == NO_EFFECT:
            warn.append(f"config key '{key}' ({setting.source}) has no effect here: {spec.advice}")
            accepted[key] = setting.value
        elif not _gate_active(spec, values):
            warn.append(
                f"config key '{key}' ({setting.source}) has no effect without "
                f"{GATES[spec.gate].text} (in GPT-NeoX too); ignored"
            )
            accepted[key] = setting.value
        else:
            refused.append(_refusal(key, setting, spec))
    if refused:
        raise ConfigError("\n".join(refused))
    return accepted, implied


def check_computed_keys(cfg: Config, computed: dict[str, Setting], warn: list[str]) -> None:
    """Keys GPT-NeoX computes: ignored with a warning, or refused where they contradict what
    we compute (`DERIVED_MUST_AGREE`)."""
    refused = []
    for key, setting in computed.items():
        if key in DERIVED_MUST_AGREE:
            ours, how = DERIVED_MUST_AGREE[key]
            resolved = cfg.get(ours)
            given = setting.value
            same = (
                str(given).lower() == str(resolved).lower()
                if isinstance(given, str)
                else given == resolved
            )
            if not same:
                refused.append(
                    f"config key '{key}' ({setting.source}) is {given!r} but the config "
                    f"resolves it to {resolved!r}; GPT-NeoX computes it too, from {how}: set "
                    "that instead and remove the key"
                )
                continue
        warn.append(f"config key '{key}' ({setting.source}) is computed, not read; ignored")
    if refused:
        raise ConfigError("\n".join(refused))


def check_refused_values(cfg: Config, sources: dict[str, str]) -> None:
    """Schema values that nothing here builds (`REFUSED_VALUES`), refused before launch."""
    refused = []
    for (key, value), advice in REFUSED_VALUES.items():
        if cfg.get(key) == value:
            where = f" ({sources[key]})" if key in sources else ""
            refused.append(f"config key '{key}'{where}: '{value}' is not supported: {advice}")
    if refused:
        raise ConfigError("\n".join(refused))
