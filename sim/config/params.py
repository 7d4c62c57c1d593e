"""The ``params`` of a policy or predictor: the defaults a part declares (its ``PARAMS``), the rules it states for
some of them (its ``PARAM_RULES``: a range, a choice of words, a type where the default is None, a file), and
their validation into the full params mapping, defaults filled.

Without a rule, a param takes a value of its default's type (an int where a float is declared), and a number within
``INT_MAX`` / ``NUMBER_MAX``; null only where the default itself is None.

Every param a registered part declares must also state what it accepts (:meth:`Parametrised.declaration_problems`,
checked when the part registers): a number its range, a string its words or that it names a file, a param whose
default is None its type; only true/false params need no rule. So no value a config gives can reach a part
unchecked, and every wrong value is refused when the config loads, not when the run starts.

Some checks need the run: a training trace (:func:`training_trace`) must be of the run's model, hold routed tokens,
and not be the evaluated trace. :meth:`Parametrised.check_for_run` makes them when the config loads, once the
model and the workload trace are known (:class:`RunFacts`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moebase.checks import INT_MAX, NUMBER_MAX, join, key_text, known_text, real, show
from moebase.errors import ConfigError
from moebase.files import resolve_path

MAX_TEXT = 4096  # the longest string a param takes
MAX_EXPERTS = 1 << 15  # the most experts a layer has (trace ids are int16): a bound for counts of experts


@dataclass(frozen=True)
class Rule:
    """What a param accepts beyond its default's type.

    ``minimum``/``maximum``: an inclusive range for a number (``above``: the minimum itself excluded); ``choices``:
    the words a string may be (with ``file``: words it may be in place of a path); ``kind``: the type when the
    default is None (int, float, str, bool); ``file``: the string names an existing regular file of this kind
    ("trace file"); ``required``: null is refused even though the default is None (``hint`` says what to give);
    ``training``: the file is a training trace, checked against the run when the config loads
    (:meth:`Parametrised.check_for_run`)."""

    minimum: float | None = None
    maximum: float | None = None
    above: bool = False
    choices: tuple[str, ...] | None = None
    kind: type | None = None
    file: str | None = None
    required: bool = False
    hint: str = ""
    training: bool = False
    #: a string must match this regular expression in full (with ``what``, the words that say what it is)
    pattern: str | None = None


def between(minimum: float | None, maximum: float | None, kind: type | None = None, above: bool = False) -> Rule:
    """A number in [minimum, maximum] ((minimum, maximum] with ``above``)."""
    return Rule(minimum=minimum, maximum=maximum, kind=kind, above=above)


def one_of(*choices: str) -> Rule:
    """One of these words."""
    return Rule(choices=tuple(choices), kind=str)


def matching(pattern: str, what: str) -> Rule:
    """A string matching the regular expression ``pattern`` in full; ``what`` says what it is (in messages)."""
    return Rule(kind=str, pattern=pattern, hint=what)


def file_path(what: str = "file", required: bool = False, hint: str = "") -> Rule:
    """A path to an existing regular file (resolved as :func:`moebase.files.resolve_path` does)."""
    return Rule(kind=str, file=what, required=required, hint=hint)


def training_trace(required: bool = False, hint: str = "", words: tuple[str, ...] = ()) -> Rule:
    """A path to a training trace: a trace file of the run's model, with routed tokens, other than the evaluated
    trace (checked when the config loads, see :func:`traces.summary.check_training_trace`); or one of
    ``words``, which the part itself gives a meaning (no file)."""
    return Rule(kind=str, file="trace file", required=required, hint=hint, training=True, choices=tuple(words) or None)


def names_file(rule: Rule | None, value: Any) -> bool:
    """Whether ``value`` of a param with ``rule`` is a path to a file (not null, not one of the rule's words)."""
    return rule is not None and rule.file is not None and isinstance(value, str) and value not in (rule.choices or ())


@dataclass(frozen=True)
class RunFacts:
    """What the params of a part may be checked against when a config loads: the run's model (a
    :class:`moebase.model.ModelSpec`) and its workload trace (the path, and its
    :class:`traces.summary.TraceSummary`)."""

    model: Any
    trace_path: Path
    trace: Any


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

    @classmethod
    def check_for_run(cls, params: dict, where: str, run: RunFacts) -> None:
        """Checks of the (already resolved) params against the run, when the config loads: every training trace
        is of the run's model, has routed tokens and is not the evaluated trace. A part whose params have other
        limits that depend on the model adds them here."""
        from traces.summary import check_training_trace

        for key, rule in cls.PARAM_RULES.items():
            if rule.training and names_file(rule, params.get(key)):
                check_training_trace(params[key], join(where, key), run.model, run.trace_path)

    @classmethod
    def check_with_cache(cls, params: dict, where: str, run: RunFacts, cache: Any) -> None:
        """Checks of the params against the run's cache (its slots and cached layers), when the config loads,
        after the cache section: none by default."""

    @classmethod
    def declaration_problems(cls) -> list[str]:
        """What is missing from the declaration of the params (empty when every param states what it accepts):
        a number without both ends of its range, a string without its words or a file, a param whose default is
        None without a type, a rule for a param that is not declared, a default its own rule refuses."""
        out = []
        for name in cls.PARAM_RULES:
            if name not in cls.PARAMS:
                out.append(f"rule for {name!r}, which is not in PARAMS")
        for name, default in cls.PARAMS.items():
            problem = _declaration_problem(default, cls.PARAM_RULES.get(name))
            if problem:
                out.append(f"param {name!r} {problem}")
        return out


def _declaration_problem(default: Any, rule: Rule | None) -> str | None:
    """What the declaration of one param lacks (None: nothing)."""
    kind = (rule.kind if rule is not None else None) or (None if default is None else type(default))
    if kind is None:
        return "has no type: its default is None and no rule gives a kind"
    if kind not in (bool, int, float, str):
        return f"has a {kind.__name__} default: params are numbers, strings or true/false"
    if kind in (int, float) and (rule is None or rule.minimum is None or rule.maximum is None):
        return "is a number without a declared range (a rule with its minimum and maximum)"
    if kind is str and (rule is None or (rule.choices is None and rule.file is None and rule.pattern is None)):
        return "is a string without declared choices or a file kind"
    if default is not None:
        try:
            check_param(default, default, rule, "default")
        except ConfigError as exc:
            return f"has a default its own rule refuses ({exc.problem})"
    return None


def resolve_params(
    declared: dict[str, Any], given: dict | None, where: str, rules: dict[str, Rule] | None = None
) -> dict[str, Any]:
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
        raise ConfigError(
            join(where, key_text(unknown[0])), f"unknown parameter ({known_text(unknown[0], sorted(declared))})"
        )
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
        ok = 0 < len(value) <= MAX_TEXT and (rule.choices is None or rule.file is not None or value in rule.choices)
        ok = ok and (rule.pattern is None or re.fullmatch(rule.pattern, value) is not None)
    if not ok:
        raise ConfigError(where, f"must be {_want(kind, rule)}, got {show(value)}")
    if rule.file is not None and names_file(rule, value):
        try:
            resolve_path(value, where, rule.file)
        except ConfigError as exc:
            if not rule.choices:
                raise
            raise ConfigError(exc.field, f"{exc.problem} (or give one of {', '.join(rule.choices)})") from None
    return value


def _range(kind: type, rule: Rule) -> tuple[float, float]:
    big = INT_MAX if kind is int else NUMBER_MAX
    lo = -big if rule.minimum is None else rule.minimum
    hi = big if rule.maximum is None else rule.maximum
    return lo, hi


def _want(kind: type | None, rule: Rule) -> str:
    """What a param takes, in words."""
    if rule.file is not None:
        return f"a path to a {rule.file}" + (f" or one of {', '.join(rule.choices)}" if rule.choices else "")
    if rule.choices is not None:
        return f"one of {', '.join(rule.choices)}"
    if rule.pattern is not None:
        return rule.hint or f"a string matching {rule.pattern}"
    if kind in (int, float):
        lo, hi = _range(kind, rule)
        if kind is int:
            return f"an integer in [{int(lo)}, {int(hi)}]"
        return f"a number in {'(' if rule.above else '['}{lo:g}, {hi:g}]"
    names: dict[type | None, str] = {bool: "true or false", str: "a non-empty string"}
    return names.get(kind, f"a {getattr(kind, '__name__', 'value')}")


__all__ = [
    "MAX_EXPERTS",
    "Parametrised",
    "Rule",
    "RunFacts",
    "between",
    "check_param",
    "file_path",
    "matching",
    "names_file",
    "one_of",
    "resolve_params",
    "training_trace",
]
