"""The ``params`` of a policy or predictor: the defaults a part declares (its ``PARAMS``), the rules it states for
some of them (its ``PARAM_RULES``: a range, a choice of words, a type where the default is None, a file), and
their validation into the full params mapping, defaults filled.

Without a rule, a param takes a value of its default's type (an int where a float is declared), and a number within
``INT_MAX`` / ``NUMBER_MAX``; null only where the default itself is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.checks import INT_MAX, NUMBER_MAX, join, real, show
from sim.errors import ConfigError
from sim.files import resolve_path

MAX_TEXT = 4096  # the longest string a param takes


@dataclass(frozen=True)
class Rule:
    """What a param accepts beyond its default's type.

    ``minimum``/``maximum``: an inclusive range for a number (``above``: the minimum itself excluded); ``choices``:
    the words a string may be; ``kind``: the type when the default is None (int, float, str, bool); ``file``: the
    string names an existing regular file of this kind ("trace file"); ``required``: null is refused even though
    the default is None (``hint`` says what to give)."""

    minimum: float | None = None
    maximum: float | None = None
    above: bool = False
    choices: tuple[str, ...] | None = None
    kind: type | None = None
    file: str | None = None
    required: bool = False
    hint: str = ""


def between(minimum: float | None, maximum: float | None, kind: type | None = None, above: bool = False) -> Rule:
    """A number in [minimum, maximum] ((minimum, maximum] with ``above``)."""
    return Rule(minimum=minimum, maximum=maximum, kind=kind, above=above)


def one_of(*choices: str) -> Rule:
    """One of these words."""
    return Rule(choices=tuple(choices), kind=str)


def file_path(what: str = "file", required: bool = False, hint: str = "") -> Rule:
    """A path to an existing regular file (resolved as :func:`sim.files.resolve_path` does)."""
    return Rule(kind=str, file=what, required=required, hint=hint)


class Parametrised:
    """A part a config names with ``params`` (a policy, a predictor): its declared params and their rules, and the
    check a config runs on them when it loads (no run context needed)."""

    #: The params a config may give, with their defaults.
    PARAMS: dict[str, Any] = {}
    #: Bounds, choices or types of some params beyond their default's type (see :class:`Rule`).
    PARAM_RULES: dict[str, Rule] = {}
    #: Where the params sit in a run config (errors name it).
    WHERE = "params"

    @classmethod
    def check_params(cls, params: dict | None, where: str | None = None) -> dict:
        """The full params (defaults filled) for ``params`` as a config gives them; ConfigError when one is unknown,
        of the wrong type or out of its rule."""
        where = where or cls.WHERE
        out = resolve_params(cls.PARAMS, params, where, cls.PARAM_RULES)
        cls.validate_params(out, where)
        return out

    @classmethod
    def validate_params(cls, params: dict, where: str) -> None:
        """Checks between params, beyond each one's rule (none here)."""


def resolve_params(declared: dict[str, Any], given: dict | None, where: str,
                   rules: dict[str, Rule] | None = None) -> dict[str, Any]:
    """Defaults overridden by ``given``; an unknown name, a value of the wrong type or outside its rule raises
    ConfigError naming ``where.NAME``. Returns every declared param."""
    rules = rules or {}
    given = {} if given is None else given
    if not isinstance(given, dict):
        raise ConfigError(where, f"must be a mapping, got {show(given)}")
    bad = [k for k in given if not isinstance(k, str)]
    if bad:
        raise ConfigError(where, f"keys must be strings, got {show(bad[0])}")
    unknown = sorted(set(given) - set(declared))
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise ConfigError(join(where, unknown[0]), f"unknown parameter (known: {known})")
    out = dict(declared)
    for key, value in given.items():
        out[key] = check_param(value, declared[key], rules.get(key), join(where, key))
    for key, rule in rules.items():
        if rule.required and out.get(key) is None:
            raise ConfigError(join(where, key), f"missing{': ' + rule.hint if rule.hint else ''}")
    return out


def check_param(value: Any, default: Any, rule: Rule | None, where: str) -> Any:
    """One param's clean value (see :func:`resolve_params`)."""
    rule = rule or Rule()
    kind = rule.kind or (None if default is None else type(default))
    if value is None:
        if default is None and not rule.required:
            return None
        raise ConfigError(where, f"must be {_want(kind, rule)}, got null" + (f" ({rule.hint})" if rule.hint else ""))
    if kind is None:
        return value
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is float:
        ok = real(value) is not None
        value = float(value) if ok else value
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if ok and kind in (int, float):
        lo, hi = _range(kind, rule)
        ok = (value > lo if rule.above else value >= lo) and value <= hi
    if ok and kind is str:
        ok = 0 < len(value) <= MAX_TEXT and (rule.choices is None or value in rule.choices)
    if not ok:
        raise ConfigError(where, f"must be {_want(kind, rule)}, got {show(value)}")
    if rule.file is not None:
        resolve_path(value, where, rule.file)
    return value


def _range(kind: type, rule: Rule) -> tuple[float, float]:
    big = INT_MAX if kind is int else NUMBER_MAX
    lo = -big if rule.minimum is None else rule.minimum
    hi = big if rule.maximum is None else rule.maximum
    return lo, hi


def _want(kind: type | None, rule: Rule) -> str:
    """What a param takes, in words."""
    if rule.file is not None:
        return f"a path to a {rule.file}"
    if rule.choices is not None:
        return f"one of {', '.join(rule.choices)}"
    if kind in (int, float):
        lo, hi = _range(kind, rule)
        if kind is int:
            return f"an integer in [{int(lo)}, {int(hi)}]"
        return f"a number in {'(' if rule.above else '['}{lo:g}, {hi:g}]"
    names = {bool: "true or false", str: "a non-empty string"}
    return names.get(kind, f"a {getattr(kind, '__name__', 'value')}")


__all__ = ["Rule", "between", "check_param", "file_path", "one_of", "resolve_params"]
