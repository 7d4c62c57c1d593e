"""Field checks for run configs and profiles: each takes a user's value and the field's dotted name, and returns the
clean value or raises :class:`~moebase.errors.ConfigError` naming the field, on one bounded line.

Every integer and real field has an upper bound (``INT_MAX``, ``NUMBER_MAX`` unless the field states a tighter
one), so that no value the user writes can overflow a float, an int64 or an allocation later on.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Any, Literal, overload

from moebase.errors import ConfigError

INT_MAX = 2**31 - 1  # the largest integer a field accepts unless it states its own bound
NUMBER_MAX = 1e12  # the largest real number a field accepts unless it states its own bound
NAME_CHARS = 256  # the longest name (model, hardware, policy, ...)
MAX_DEPTH = 32  # the deepest nesting a config or profile may have
MAX_VALUES = 200_000  # the most values a config or profile may hold (each repeat of a YAML alias counts)
SHOW_CHARS = 60  # an echoed value longer than this is abbreviated
LIST_CHARS = 250  # a list of known names longer than this is shown as its closest matches and a count

#: A check: ``check(value, where)`` returns the clean value or raises ConfigError naming ``where``.
Check = Callable[[Any, str], Any]


# --------------------------------------------------------------------------------------------- echoing values
def kind_of(value: Any) -> str:
    """What a file's whole content turned out to be, without its content: "a string", "a list", "nothing (an
    empty file)". For errors about a file of the wrong shape, which must not echo what the file holds."""
    if value is None:
        return "nothing (an empty file)"
    names = {str: "a string", list: "a list", dict: "a mapping", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), f"a {type(value).__name__}")


def show(value: Any) -> str:
    """A short rendering of a user's value for an error message: never long, never an exception (a huge integer,
    a deep or aliased structure, a long string are described, not printed)."""
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**30 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, str):
        if len(value) <= SHOW_CHARS:
            return repr(value)
        return f"{value[:SHOW_CHARS]!r}... ({len(value)} characters)"
    if isinstance(value, (dict, list, tuple)):
        text = _short_repr(value, SHOW_CHARS)
        return text if text is not None else f"a {type(value).__name__}"
    try:
        text = repr(value)
    except Exception:  # a repr may fail on anything odd: describe it instead
        text = ""
    return text if 0 < len(text) <= SHOW_CHARS else f"a {type(value).__name__}"


def _short_repr(value: Any, budget: int, depth: int = 0) -> str | None:
    """``repr`` of a small, shallow container (items shown with :func:`show`), or None when it would exceed
    ``budget`` characters or 3 levels."""
    if not isinstance(value, (dict, list, tuple)):
        return show(value)
    if depth >= 3 or len(value) > budget:
        return None
    parts, used = [], 2
    for item in value.items() if isinstance(value, dict) else value:
        if isinstance(value, dict):
            key, val = _short_repr(item[0], budget, depth + 1), _short_repr(item[1], budget, depth + 1)
            piece = None if key is None or val is None else f"{key}: {val}"
        else:
            piece = _short_repr(item, budget, depth + 1)
        if piece is None:
            return None
        used += len(piece) + 2
        if used > budget:
            return None
        parts.append(piece)
    ends = "{}" if isinstance(value, dict) else "()" if isinstance(value, tuple) else "[]"
    body = ", ".join(parts) + ("," if isinstance(value, tuple) and len(parts) == 1 else "")
    return ends[0] + body + ends[1]


def known_text(value: Any, names, see: str | None = None) -> str:
    """The known names for an error about an unknown ``value``, bounded: ``known: a, b, c`` when they are few,
    else the few closest to ``value`` and how many there are, ``closest: a, b; 33 in all: see configs/hardware/``
    (``see`` says where they are listed)."""
    names = [str(n) for n in names]
    listed = ", ".join(names)
    if len(listed) <= LIST_CHARS:
        return f"known: {listed or 'none'}"
    where = f": see {see}" if see else ""
    close = []
    if isinstance(value, str):
        close = difflib.get_close_matches(value[:NAME_CHARS], names, n=3, cutoff=0.6)
    shown = [n if len(n) <= 40 else n[:37] + "..." for n in (close or names[:3])]
    lead = "closest" if close else "e.g."
    return f"{lead}: {', '.join(shown)}; {len(names)} in all{where}"


def key_text(key: Any) -> str:
    """A user's key as part of a field's dotted name: cut to SHOW_CHARS characters (a 5,000-character key must not
    fill the message)."""
    text = str(key)
    return text if len(text) <= SHOW_CHARS else text[: SHOW_CHARS - 3] + "..."


def join(where: str, key: Any) -> str:
    """The dotted name of ``key`` under ``where``."""
    return f"{where}.{key}" if where else str(key)


# --------------------------------------------------------------------------------------------- structure
def check_mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(where, f"must be a mapping, got {show(value)}")
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise ConfigError(where, f"keys must be strings, got {show(bad[0])}")
    return value


def check_keys(d: dict, where: str, required=(), optional=(), suffix: str = "", see: str | None = None) -> None:
    """Unknown keys first (the likelier typo), then missing ones. A long list of known keys is shown as the
    closest few and their count (``see``: where they are listed)."""
    known = list(required) + [k for k in optional if k not in required]
    for k in d:
        if k not in known:
            raise ConfigError(join(where, key_text(k)), f"unknown key ({known_text(k, known, see)}){suffix}")
    for k in required:
        if k not in d:
            raise ConfigError(join(where, k), f"missing{suffix}")


def check_size(value: Any, where: str, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> Any:
    """A nested value (mappings and lists) at most ``max_depth`` levels deep holding at most ``max_values`` values,
    repeats of a shared (aliased) part counted each time, as a copy or a JSON dump would. Walks without recursion."""
    stack: list[tuple[Any, int, Any]] = [(value, 0, None)]
    seen = 0
    while stack:
        item, depth, top = stack.pop()
        seen += 1
        if seen > max_values:
            raise ConfigError(_at(where, top), f"holds more than {max_values} values")
        if isinstance(item, dict):
            children = list(item.items())
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = list(enumerate(item))
        else:
            continue
        if depth >= max_depth:
            raise ConfigError(_at(where, top), f"nests deeper than {max_depth} levels")
        if len(children) > max_values:
            raise ConfigError(_at(where, top), f"holds more than {max_values} values")
        for key, child in children:
            stack.append((child, depth + 1, key if top is None else top))
    return value


def _at(where: str, top: Any) -> str:
    """The field a problem of ``check_size`` lies in: the top-level key under ``where``."""
    return (where or "config") if top is None else join(where, top)


# --------------------------------------------------------------------------------------------- scalars
@overload
def check_int(
    value: Any,
    where: str,
    minimum: int | None = None,
    maximum: int | None = INT_MAX,
    allow_none: Literal[False] = False,
) -> int: ...
@overload
def check_int(
    value: Any, where: str, minimum: int | None = None, maximum: int | None = INT_MAX, *, allow_none: bool
) -> int | None: ...
def check_int(
    value: Any, where: str, minimum: int | None = None, maximum: int | None = INT_MAX, allow_none: bool = False
) -> int | None:
    """An integer (not a bool) in [minimum, maximum]; ``maximum`` defaults to INT_MAX."""
    if value is None and allow_none:
        return None
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return int(value)
    if minimum is not None and maximum is not None:
        want = f"an integer in [{minimum}, {maximum}]"
    elif minimum is not None:
        want = f"an integer >= {minimum}"
    elif maximum is not None:
        want = f"an integer <= {maximum}"
    else:
        want = "an integer"
    if allow_none:
        want += " or null"
    raise ConfigError(where, f"must be {want}, got {show(value)}")


def real(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a real number (bools, huge ints, NaN, inf excluded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > 2**1000:  # float() of it would overflow
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def check_number(
    value: Any, where: str, minimum: float = 0.0, strict: bool = True, maximum: float | None = NUMBER_MAX
) -> float:
    """A finite real number > minimum (strict) or >= minimum, and <= maximum (NUMBER_MAX unless given)."""
    v = real(value)
    if v is not None and (v > minimum if strict else v >= minimum) and (maximum is None or v <= maximum):
        return v
    rel = ">" if strict else ">="
    want = f"a number {rel} {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
    raise ConfigError(where, f"must be {want}, got {show(value)}")


@overload
def check_str(value: Any, where: str, allow_none: Literal[False] = False, max_chars: int = NAME_CHARS) -> str: ...
@overload
def check_str(value: Any, where: str, allow_none: bool, max_chars: int = NAME_CHARS) -> str | None: ...
def check_str(value: Any, where: str, allow_none: bool = False, max_chars: int = NAME_CHARS) -> str | None:
    """A non-empty string of at most ``max_chars`` characters."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, f"must be a non-empty string, got {show(value)}")
    if len(value) > max_chars:
        raise ConfigError(where, f"must be at most {max_chars} characters, got {len(value)}")
    return value


def check_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(where, f"must be true or false, got {show(value)}")
    return value


def check_choice(value: Any, where: str, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(where, f"must be one of {', '.join(choices)}, got {show(value)}")
    return value


# --------------------------------------------------------------------------------------------- check makers
def integer(minimum: int | None = None, maximum: int | None = INT_MAX, allow_none: bool = False) -> Check:
    """A check for an integer field (see :func:`check_int`)."""
    return lambda value, where: check_int(value, where, minimum, maximum, allow_none=allow_none)


def number(minimum: float = 0.0, maximum: float | None = NUMBER_MAX, strict: bool = True) -> Check:
    """A check for a real-valued field (see :func:`check_number`)."""
    return lambda value, where: check_number(value, where, minimum, strict, maximum)


def one_of(*choices: str) -> Check:
    """A check for a field that takes one of some words."""
    return lambda value, where: check_choice(value, where, choices)


def text(allow_none: bool = False, max_chars: int = NAME_CHARS) -> Check:
    """A check for a non-empty string field."""
    return lambda value, where: check_str(value, where, allow_none, max_chars)


__all__ = [
    "kind_of",
    "INT_MAX",
    "MAX_DEPTH",
    "MAX_VALUES",
    "NAME_CHARS",
    "NUMBER_MAX",
    "Check",
    "check_bool",
    "check_choice",
    "check_int",
    "check_keys",
    "check_mapping",
    "check_number",
    "check_size",
    "check_str",
    "integer",
    "join",
    "key_text",
    "known_text",
    "number",
    "one_of",
    "real",
    "show",
    "text",
]
