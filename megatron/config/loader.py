"""Read config files (YAML, JSON, TOML) and command-line overrides into one flat mapping.

Files are merged in the order given. Top-level keys are normalised (`-` and `_` are the same),
a key set in two files is an error naming both, `!include other.yml` inserts another file as
the value of a key, and `--set key=value` overrides (typed by YAML, dotted keys reach into
sections) win over every file.
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from megatron.config.schema import ConfigError

CONFIG_SUFFIXES = (".yml", ".yaml", ".json", ".toml")
CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"


@dataclass(frozen=True)
class Setting:
    """One top-level key's value and where it came from (a file path or `--set`)."""

    value: Any
    source: str


def normalise_key(key: str) -> str:
    return str(key).strip().replace("-", "_")


def find_config_file(name: str, configs_dir: Path = CONFIGS_DIR) -> Path:
    """A path as given, or a bare name looked up under `configs/` (with or without suffix)."""
    path = Path(name)
    if path.is_file():
        return path
    candidates = [configs_dir / name] + [configs_dir / (name + s) for s in CONFIG_SUFFIXES]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"config file '{name}' not found, nor as {configs_dir / name} (with or without "
        f"{'/'.join(CONFIG_SUFFIXES)}){_near(path, configs_dir)}"
    )


def _near(path: Path, configs_dir: Path = CONFIGS_DIR) -> str:
    """'; did you mean ...?' naming config files beside `path` (or in configs/) like it."""
    folder = path.parent if path.parent.is_dir() else configs_dir
    files = {p.name: p for p in folder.glob("*") if p.suffix in CONFIG_SUFFIXES}
    close = difflib.get_close_matches(path.name, list(files), n=3, cutoff=0.6)
    if not close and folder != configs_dir:
        return _near(configs_dir / path.name, configs_dir)
    shown = [str(path.parent / c) if folder == path.parent else str(files[c]) for c in close]
    return f"; did you mean {' or '.join(repr(c) for c in shown)}?" if close else ""


def _yaml_loader(path: Path, stack: tuple[Path, ...]) -> type[yaml.SafeLoader]:
    class Loader(yaml.SafeLoader):
        pass

    def include(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        target = (path.parent / loader.construct_scalar(node)).resolve()
        if target in stack:
            chain = " -> ".join(str(p) for p in (*stack, target))
            raise ConfigError(f"!include cycle: {chain}")
        if not target.is_file():
            raise ConfigError(f"{path}: !include target '{node.value}' not found ({target})")
        return read_file(target, stack)

    Loader.add_constructor("!include", include)
    return Loader


def read_file(path: Path, stack: tuple[Path, ...] = ()) -> Any:
    """Parse one YAML/JSON/TOML file; syntax errors name the file and position."""
    path = Path(path).resolve()
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            return json.loads(text)
        if suffix == ".toml":
            return tomllib.loads(text)
        return yaml.load(text, Loader=_yaml_loader(path, (*stack, path)))  # noqa: S506
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot parse config file {path}: {err}") from None


def load_files(names: list[str], configs_dir: Path = CONFIGS_DIR) -> dict[str, Setting]:
    """Merge config files in order into `{key: Setting}`; a key in two files is an error."""
    merged: dict[str, Setting] = {}
    for name in names:
        path = find_config_file(name, configs_dir)
        data = read_file(path)
        if data is None:
            continue
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of keys to values")
        for raw_key, value in data.items():
            key = normalise_key(raw_key)
            if key in merged:
                raise ConfigError(
                    f"config key '{key}' is set in both {merged[key].source} and {path}; "
                    "set it in one file only (or override it with --set)"
                )
            merged[key] = Setting(value, str(path))
    return merged


def apply_overrides(settings: dict[str, Setting], overrides: list[str]) -> dict[str, Setting]:
    """Apply `key=value` overrides; values are typed by YAML; `a.b.c=v` sets inside sections."""
    result = dict(settings)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got '{item}'")
        dotted, text = item.split("=", 1)
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        head, *rest = [normalise_key(p) if i == 0 else p for i, p in enumerate(dotted.split("."))]
        if not rest:
            result[head] = Setting(value, "--set")
            continue
        base = result.get(head, Setting({}, "--set")).value
        section = json.loads(json.dumps(base)) if isinstance(base, dict) else {}
        node = section
        for part in rest[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {dotted}: '{part}' is not a section")
        node[rest[-1]] = value
        result[head] = Setting(section, "--set")
    return result


def describe_sources(settings: dict[str, Setting]) -> list[str]:
    """The distinct files the settings came from, in order."""
    seen: list[str] = []
    for s in settings.values():
        if s.source not in seen and os.path.exists(s.source):
            seen.append(s.source)
    return seen
