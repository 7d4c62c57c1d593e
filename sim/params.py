"""Validation of the ``params`` mapping of a policy or predictor against the defaults it declares."""

from __future__ import annotations

from typing import Any

from sim.errors import ConfigError


def resolve_params(declared: dict[str, Any], given: dict | None, where: str) -> dict[str, Any]:
    """Defaults overridden by ``given``; unknown names and values of the wrong type raise ConfigError.

    A declared default's type is the expected type (ints accepted where floats are; None means "any").
    """
    given = {} if given is None else given
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: must be a mapping, got {type(given).__name__}")
    unknown = sorted(set(given) - set(declared))
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise ConfigError(f"{where}.{unknown[0]}: unknown parameter (known: {known})")
    out = dict(declared)
    for key, value in given.items():
        default = declared[key]
        if default is not None and value is not None:
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, float):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
                value = float(value) if ok else value
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            else:
                ok = isinstance(value, type(default))
            if not ok:
                raise ConfigError(f"{where}.{key}: expected {type(default).__name__}, got {value!r}")
        out[key] = value
    return out
