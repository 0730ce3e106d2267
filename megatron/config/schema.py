"""Typed config fields: value checking against annotations, and field docstrings.

Each config group is a frozen dataclass whose fields carry a docstring written directly under them
(as in the source of `megatron/config/groups/model.py`). Python drops those strings at run time, so
`field_docs` reads them back from the source with `ast`; `--describe` and `configs/README.md` are
both generated from them. A field declared with `documented` gets text written from a table appended
(the optimizer types of `optimizer.py`), so a docstring never repeats a list the code keeps.

`coerce(key, value, annotation)` checks one value from a config file against a field's
annotation and returns it normalised (numeric strings such as `6e-4` that YAML 1.1 reads as
text become floats, a lone path becomes a one-element list), or raises `ConfigError` naming the
key, the value and what would be valid.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from typing import Any, Literal, Union


class ConfigError(ValueError):
    """A config file, key or value is wrong; the message says where and what would be valid."""


def set_in(sources: dict[str, str], *keys: str) -> str:
    """` (key in file; ...)` for those of `keys` a config file set, for error messages."""
    found = [f"{k} in {sources[k]}" for k in keys if k in sources]
    return f" ({'; '.join(found)})" if found else ""


def _where(source: str | None) -> str:
    return f" (in {source})" if source else ""


def type_name(annotation: Any) -> str:
    """A short human-readable name of an annotation: `int`, `one of 'a', 'b'`, `list of str`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        parts = [type_name(a) for a in args if a is not type(None)]
        name = " or ".join(parts)
        return f"{name} or null" if type(None) in args else name
    if origin in (list, tuple):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict or annotation is dict:
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _is_number_text(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def coerce(key: str, value: Any, annotation: Any, source: str | None = None) -> Any:
    """Check `value` against `annotation`; return the normalised value or raise ConfigError."""
    ok, result = _coerce(value, annotation)
    if ok:
        return result
    raise ConfigError(
        f"config key '{key}'{_where(source)}: value {value!r} is not valid; "
        f"expected {type_name(annotation)}"
    )


def _coerce(value: Any, annotation: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return True, value
    if origin in (Union, types.UnionType):
        if value is None:
            return type(None) in args, None
        for arg in args:
            if arg is type(None):
                continue
            ok, result = _coerce(value, arg)
            if ok:
                return True, result
        return False, None
    if origin is Literal:
        if isinstance(value, str):
            for choice in args:
                if isinstance(choice, str) and choice.lower() == value.lower():
                    return True, choice
        return (value in args and not isinstance(value, bool)), value
    if origin in (list, tuple):
        items = [value] if isinstance(value, str | int | float) else value
        if not isinstance(items, list | tuple):
            return False, None
        out = []
        for item in items:
            ok, result = _coerce(item, args[0] if args else Any)
            if not ok:
                return False, None
            out.append(result)
        return True, out
    if origin is dict or annotation is dict:
        return isinstance(value, dict), value
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        if isinstance(value, bool):
            return False, None
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        if isinstance(value, str) and _is_number_text(value) and float(value).is_integer():
            return True, int(float(value))
        return False, None
    if annotation is float:
        if isinstance(value, bool):
            return False, None
        if isinstance(value, int | float):
            return True, float(value)
        if isinstance(value, str) and _is_number_text(value):
            return True, float(value)
        return False, None
    if annotation is str:
        return isinstance(value, str), value
    return isinstance(value, annotation), value


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of dataclass `cls`, read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs: dict[str, str] = {}
    for node, following in zip(body, body[1:] + [None]):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(following.value.value)
    for f in dataclasses.fields(cls):
        if more := f.metadata.get("doc_more"):
            docs[f.name] = f"{docs.get(f.name, '')}\n{textwrap.fill(more, 92)}".strip()
    return docs


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of the fields of dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def is_derived(cls: type, name: str) -> bool:
    """Derived fields are computed by resolution and never read from a config file."""
    return {f.name: f for f in dataclasses.fields(cls)}[name].metadata.get("derived", False)


def documented(default: Any, more: str) -> Any:
    """Declare a field whose docstring ends with `more`: text written from a table (the valid
    values, say), so the docstring does not list them a second time."""
    return dataclasses.field(default=default, metadata={"doc_more": more})


def derived(default: Any = None) -> Any:
    """Declare a field that resolution computes (not settable from a file)."""
    return dataclasses.field(default=default, metadata={"derived": True})
