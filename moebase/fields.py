"""Config dataclasses declare the keys a mapping sets on them: a field made with :func:`setting` says its key, its
default and its check, so that the accepted keys, the ``--set`` schema, the defaults and the plain-data form of a
config all come from the dataclass (adding a field is one edit).

``setting(default, check)`` keeps the default in the field's metadata, not in the constructor, so a dataclass's
signature does not change; ``constructor_default=True`` makes it the constructor's default too.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moebase.checks import Check, join
from moebase.errors import ConfigError

#: The default of a key that must be given.
REQUIRED = dataclasses.MISSING


def setting(
    default: Any = REQUIRED,
    check: Check | None = None,
    *,
    key: str | None = None,
    scale: float = 1.0,
    divisor: float = 1.0,
    as_int: bool = False,
    null_is_default: bool = False,
    nested: Any = None,
    free: bool = False,
    wrap: str | None = None,
    constructor_default: bool = False,
) -> Any:
    """A dataclass field set from a mapping.

    - ``default``: the value when the key is absent (REQUIRED: it must be given); a callable ``default(values,
      where)`` computes it from the fields read before it (``values``, by field name, in file units).
    - ``check(value, where)``: returns the clean value or raises ConfigError (None: taken as is).
    - ``key``: the key in the mapping, when it differs from the field's name (a unit in its name, say).
    - ``scale``, ``divisor``: the field holds ``value * scale`` or ``value / divisor`` (file units -> SI: GB -> bytes,
      us -> s), rounded to an int with ``as_int``.
    - ``null_is_default``: a null value means the default (else it goes to ``check`` like any value).
    - ``nested``: the dataclass (or a tuple of them) whose keys the value's mapping has; ``free``: any keys below
      (a part's params); ``wrap``: the key a bare string here stands for when a key below it is set with ``--set``
      (``base`` for a profile name, ``name`` for a policy name). These three shape the ``--set`` schema.
    """
    meta = {
        "setting": True,
        "default": default,
        "check": check,
        "key": key,
        "scale": scale,
        "divisor": divisor,
        "as_int": as_int,
        "null_is_default": null_is_default,
        "nested": nested,
        "free": free,
        "wrap": wrap,
    }
    if constructor_default:
        return dataclasses.field(default=default, metadata=meta)
    return dataclasses.field(metadata=meta)


def settings_of(cls) -> list[dataclasses.Field]:
    """The fields of ``cls`` that a mapping sets, in declaration order."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("setting")]


def key_of(f: dataclasses.Field) -> str:
    return f.metadata["key"] or f.name


def keys_of(cls) -> tuple[str, ...]:
    """The keys a mapping may give for ``cls``."""
    return tuple(key_of(f) for f in settings_of(cls))


def required_keys(cls) -> tuple[str, ...]:
    return tuple(key_of(f) for f in settings_of(cls) if f.metadata["default"] is REQUIRED)


def read_settings(
    cls, d: dict, where: str, suffix: str = "", defaults: dict | None = None, skip: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Each setting of ``cls`` (but those in ``skip``) from the mapping ``d``, checked, in file units, by field
    name: the given value, else its default (``defaults`` overrides the declared ones by key). ``suffix`` ends
    every error message (`` (in FILE)``). Keys are not checked here (see :func:`moebase.checks.check_keys`)."""
    values: dict[str, Any] = {}
    defaults = defaults or {}
    for f in settings_of(cls):
        key = key_of(f)
        if f.name in skip:
            continue
        where_key = join(where, key)
        meta = f.metadata
        if key in d and not (d[key] is None and meta["null_is_default"]):
            value = d[key]
        else:
            value = defaults.get(key, meta["default"])
            if value is REQUIRED:
                raise ConfigError(where_key, f"missing{suffix}")
            if callable(value):
                values[f.name] = _with_suffix(suffix, value, values, where_key)
                continue
        check = meta["check"]
        values[f.name] = value if check is None else _with_suffix(suffix, check, value, where_key)
    return values


def check_setting(cls, name: str, value: Any, where: str) -> Any:
    """``value`` checked as the setting ``name`` of ``cls`` is."""
    check = next(f for f in settings_of(cls) if f.name == name).metadata["check"]
    return value if check is None else check(value, where)


def _with_suffix(suffix: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, with ``suffix`` appended to the problem of a ConfigError it raises."""
    try:
        return fn(*args)
    except ConfigError as exc:
        if not suffix:
            raise
        raise ConfigError(exc.field, exc.problem + suffix) from None


#: In a schema: any key may be set below this one.
FREE = "any"


def schema_of(*classes) -> dict:
    """The keys a mapping for these dataclasses may hold, as a tree: key -> None (a value), FREE (anything below),
    or the sub-tree of a nested mapping. A dataclass without settings contributes all its fields as values."""
    out: dict[str, Any] = {}
    for cls in classes:
        declared = settings_of(cls)
        if not declared:
            out.update({f.name: None for f in dataclasses.fields(cls)})
            continue
        for f in declared:
            meta = f.metadata
            nested = meta["nested"]
            sub: Any = FREE if meta["free"] else None
            if nested is not None:
                sub = schema_of(*(nested if isinstance(nested, tuple) else (nested,)))
                if meta["wrap"] == "base":
                    sub["base"] = None
            out[key_of(f)] = sub
    return out


def wrapped(cls) -> dict[str, str]:
    """Key -> the key a bare string there stands for (see ``wrap`` in :func:`setting`)."""
    return {key_of(f): f.metadata["wrap"] for f in settings_of(cls) if f.metadata["wrap"]}


def to_si(cls, values: dict[str, Any]) -> dict[str, Any]:
    """Field values in file units (by field name) -> the constructor's (SI) values."""
    out = {}
    for f in settings_of(cls):
        if f.name not in values:
            continue
        v, meta = values[f.name], f.metadata
        if v is not None and meta["divisor"] != 1.0:
            v = v / meta["divisor"]
        if v is not None and meta["scale"] != 1.0:
            v = v * meta["scale"]
        if meta["as_int"] and v is not None:
            v = int(round(v))
        out[f.name] = v
    return out


def to_plain(obj: Any) -> dict[str, Any]:
    """The settings of a config dataclass as plain data in file units, by key (paths as strings, nested
    dataclasses by their ``to_dict``, containers copied)."""
    out = {}
    for f in settings_of(type(obj)):
        v, meta = getattr(obj, f.name), f.metadata
        if v is not None and meta["scale"] != 1.0:
            v = v / meta["scale"]
        if v is not None and meta["divisor"] != 1.0:
            v = v * meta["divisor"]
        out[key_of(f)] = plain(v)
    return out


def plain(value: Any) -> Any:
    """A config value as plain data: a path as a string, a profile by its ``to_dict``, a config dataclass by
    :func:`to_plain`, anything else copied."""
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and settings_of(type(value)):
        return to_plain(value)
    return copy.deepcopy(value)


__all__ = [
    "FREE",
    "REQUIRED",
    "check_setting",
    "key_of",
    "keys_of",
    "plain",
    "read_settings",
    "required_keys",
    "schema_of",
    "setting",
    "settings_of",
    "to_plain",
    "to_si",
    "wrapped",
]
