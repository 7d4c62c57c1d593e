"""The sweep file: its keys, and its expansion into points (one resolved run config each).

A sweep file names a base run config, overrides for every point (``set``), and the axes to vary (``grid``: a
cartesian product; ``zip``: axes varied together). Each point is identified by a hash of its resolved config, so
the same point in two sweeps (or two runs of one sweep) has the same id.

A sweep file is input from anyone, so everything in it is bounded before it is used: its ``name`` (which becomes
the default results folder ``runs/sweep-NAME``) is a plain name, axis and field names are dotted config paths,
values are small JSON-like data, and the number of points is counted from the axis lengths, without expanding
them, and refused above ``MAX_POINTS``: each point's config is resolved and checked before anything runs. Every
problem is a ConfigError naming the sweep file and the key.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from moebase.checks import show
from moebase.errors import ConfigError
from moebase.files import PROJECT_ROOT, check_regular, file_status, read_structured_file
from sim.config.memory import DoesNotFit
from sim.sweep.capacity import parse_capacity
from sim.sweep.checks import CHECKS

SWEEP_KEYS = ("base", "set", "grid", "zip", "checks", "name", "plots", "capacity")
MAX_POINTS = 5_000  # points of one sweep: each is resolved and checked at load (3-5 ms each, mostly
# parsing the model and hardware profiles again), so loading stays under ~30 s
MAX_AXES = 32  # swept fields (grid and zip together)
MAX_SET_KEYS = 256  # fields of ``set``
MAX_VALUE_CHARS = 1_000  # an axis value, as compact JSON (it is stored in every row and shown in the report)
MAX_SET_VALUE_CHARS = 100_000  # a ``set`` value, as compact JSON (an inline model or hardware profile fits)
MAX_FIELD_CHARS = 200  # a dotted config field name
MAX_FIELD_PARTS = 32
MAX_PATH_CHARS = 4096  # the base config's path
MAX_NAME_CHARS = 100
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")  # what a base run config file is called
#: A sweep's name: a plain file name, so that ``runs/sweep-NAME`` stays inside ``runs/``.
NAME_RE = re.compile(rf"^[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}$")
#: A config field path, ``part.part...``: what ``--set`` accepts, with no ``=`` or space to confuse an override.
FIELD_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*(\.[A-Za-z0-9_][A-Za-z0-9_-]*)*$")
EXTRA_PLOT_AXES = ("cache_slots",)


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its overrides (swept fields and values) and the id of its resolved config."""

    id: str
    fields: dict
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep file: the base config, the common overrides, the swept axes and their points."""

    name: str
    base: object  # path (str) of the base run config, or an inline mapping
    common: dict  # overrides for every point
    axes: list[str]
    points: list[Point]
    checks: list[str]
    source: str
    plots: list[str] | None = None  # x axes of the throughput plots (None: every numeric swept axis)
    capacity: dict | None = None  # the capacity search each point's task runs (sim.sweep.capacity), or None


def _override(key: str, value) -> str:
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


# --------------------------------------------------------------------------------------------- names
def safe_name(text: str, fallback: str = "sweep") -> str:
    """A plain name (``NAME_RE``) made from any text: other characters become ``-``, leading dots go, cut to
    ``MAX_NAME_CHARS``; ``fallback`` when nothing is left."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).lstrip(".")[:MAX_NAME_CHARS]
    return name if NAME_RE.match(name) else fallback


def is_safe_name(text) -> bool:
    """Whether ``text`` is a plain name: usable as one file name, inside any folder."""
    return isinstance(text, str) and bool(NAME_RE.match(text))


class _Where:
    """Errors of one sweep file: ``FILE: sweep.KEY: problem``."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: sweep.{key}" if key else str(self.path), problem)


def _key_text(key) -> str:
    """A key as it may appear in a message: itself when it is a proper field name, else abbreviated."""
    return key if isinstance(key, str) and len(key) <= 80 and FIELD_RE.match(key) else show(key)


# --------------------------------------------------------------------------------------------- values
def _json_size(value, limit: int) -> int | None:
    """Characters of ``value`` as compact JSON, or None when it is not JSON-like data (a date, a set, bytes,
    a non-string key); counting stops past ``limit`` (the value is then too big anyway)."""
    stack, size = [value], 0
    while stack:
        v = stack.pop()
        if v is None or isinstance(v, bool):
            size += 5
        elif isinstance(v, int):
            size += v.bit_length() * 30103 // 100000 + 2  # its digits, without making the (maybe huge) text
        elif isinstance(v, float):
            size += len(repr(v))
        elif isinstance(v, str):
            size += len(v) + 2
        elif isinstance(v, list):
            size += 2 + len(v)
            stack.extend(v)
        elif isinstance(v, dict):
            size += 2 + 2 * len(v)
            for k, x in v.items():
                if not isinstance(k, str):
                    return None
                size += len(k) + 2
                stack.append(x)
        else:
            return None
        if size > limit:
            return size
    return size


def _check_value(value, limit: int, where, key: str) -> None:
    size = _json_size(value, limit)
    if size is None:
        raise where(key, f"value {show(value)} is not plain data (numbers, strings, booleans, null, lists, mappings)")
    if size > limit:
        raise where(key, f"a value is longer than {limit} characters")


def _check_field(key, where, section: str) -> str:
    if (
        not isinstance(key, str)
        or len(key) > MAX_FIELD_CHARS
        or not FIELD_RE.match(key)
        or key.count(".") >= MAX_FIELD_PARTS
    ):
        raise where(
            f"{section}.{_key_text(key)}" if section else _key_text(key),
            f"must be a config field path (parts of letters, digits, _ and -, joined by dots, at most "
            f"{MAX_FIELD_CHARS} characters)",
        )
    return key


def _mapping(value, where, key: str) -> dict:
    if not isinstance(value, dict):
        raise where(key, f"must be a mapping of config field -> value(s), got {show(value)}")
    return value


def _optional_mapping(d: dict, key: str, where) -> dict:
    """``d[key]``: a mapping, or nothing (missing or null: an empty one)."""
    value = d.get(key)
    return {} if value is None else _mapping(value, where, key)


def _axes(axes: dict, where, section: str) -> dict:
    """A mapping of swept field -> non-empty list of values, each bounded."""
    for key, values in axes.items():
        _check_field(key, where, section)
        if not isinstance(values, list) or not values:
            raise where(f"{section}.{key}", f"must be a non-empty list of values, got {show(values)}")
        if len(values) > MAX_POINTS:
            raise where(
                f"{section}.{key}", f"has {len(values)} values, more than the {MAX_POINTS} points a sweep may have"
            )
        for v in values:
            _check_value(v, MAX_VALUE_CHARS, where, f"{section}.{key}")
    return axes


def _zip_groups(raw, where) -> list[dict]:
    """``zip``: one mapping of axes varied together, or a list of such groups (each of equal-length axes)."""
    if raw is None or (isinstance(raw, (dict, list)) and not raw):
        return []
    groups = [raw] if isinstance(raw, dict) else raw
    if not isinstance(groups, list):
        raise where("zip", f"must be a mapping of zipped axes, or a list of such mappings, got {show(raw)}")
    out = []
    for i, g in enumerate(groups):
        section = "zip" if isinstance(raw, dict) else f"zip[{i}]"
        g = _axes(_mapping(g, where, section), where, section)
        if not g:
            raise where(section, "an empty group: give its axes, or leave it out")
        lengths = sorted({len(v) for v in g.values()})
        if len(lengths) > 1:
            raise where(
                section,
                f"every zipped axis needs the same number of values (got lengths {', '.join(map(str, lengths[:5]))})",
            )
        out.append(g)
    return out


def _sections(grid: dict, groups: list[dict]) -> list[tuple[str, str]]:
    """(section, field) of every swept field, in order: ``grid``, then ``zip`` or ``zip[i]``."""
    zipped = [("zip" if len(groups) == 1 else f"zip[{i}]", k) for i, g in enumerate(groups) for k in g]
    return [("grid", k) for k in grid] + zipped


def _check_overlaps(common: dict, swept: list[tuple[str, str]], where) -> None:
    """No field swept twice (in grid and zip, in two zip groups, or as a field and one of its parts), and no
    ``set`` field that a swept one replaces whole."""
    for i, (section, key) in enumerate(swept):
        for other_section, other in swept[:i]:
            if key == other or key.startswith(other + ".") or other.startswith(key + "."):
                also = (
                    "swept twice"
                    if key == other
                    else f"part of {other}"
                    if key.startswith(other)
                    else f"swept with its part {other}"
                )
                raise where(
                    f"{section}.{key}", f"is {also} (in {other_section} too): each field may vary on one axis only"
                )
    for key in common:
        for section, axis in swept:
            if key == axis or key.startswith(axis + "."):
                raise where(f"set.{key}", f"is also swept ({section}.{axis}): the axis would replace it at every point")


def count_points(grid: dict, groups: list[dict], limit: int = MAX_POINTS) -> int:
    """The number of points the axes make (grid lengths times zip group lengths), counted without expanding
    them and without big numbers: ``limit + 1`` as soon as it passes ``limit``."""
    n = 1
    for length in [len(v) for v in grid.values()] + [len(next(iter(g.values()))) for g in groups]:
        n *= length
        if n > limit:
            return limit + 1
    return n


def _checks(raw, where) -> list[str]:
    if raw is None:
        return []
    known = ", ".join(CHECKS)
    if not isinstance(raw, list):
        raise where("checks", f"must be a list of check names (known: {known}), got {show(raw)}")
    out = []
    for c in raw:
        if not isinstance(c, str) or c not in CHECKS:
            raise where("checks", f"unknown check {show(c)} (known: {known})")
        if c in out:
            raise where("checks", f"{c} is listed twice")
        out.append(c)
    return out


def _plots(raw, swept: list[str], where) -> list[str] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise where("plots", "must list swept fields (or cache_slots) to plot throughput against")
    for x in raw:
        if x not in swept and x not in EXTRA_PLOT_AXES:
            raise where("plots", f"{show(x)} is not a swept field (nor cache_slots)")
    if len(set(raw)) < len(raw):
        raise where("plots", "lists a field twice")
    return list(raw)


def _name(raw, path: Path, where) -> str:
    """The sweep's name: given (a plain name, ``NAME_RE``), or made from the file's name."""
    if raw is None:
        return safe_name(path.stem)
    if not is_safe_name(raw):
        raise where(
            "name",
            f"must be a plain name of at most {MAX_NAME_CHARS} letters, digits, '.', '_' or '-', "
            f"not starting with '.' (it names the results folder runs/sweep-NAME), got {show(raw)}",
        )
    return raw


# --------------------------------------------------------------------------------------------- the base config
def _base(raw, path: Path, where):
    """The base run config: an inline mapping, or the absolute path of a config file (looked for beside the
    sweep file, then in the current folder, then the project's; workers may run elsewhere)."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str) or not raw.strip() or len(raw) > MAX_PATH_CHARS or "\0" in raw:
        raise where("base", f"must be a path to a run config or an inline mapping, got {show(raw)}")
    if Path(raw).suffix.lower() not in CONFIG_SUFFIXES:  # not /etc/shadow, /proc/...: only what a config is
        raise where("base", f"must name a run config file ({', '.join(CONFIG_SUFFIXES)}), got {show(raw)}")
    given = Path(raw)
    try:
        given = given.expanduser()
    except (RuntimeError, ValueError):  # ~nosuchuser
        pass
    candidates = [given] if given.is_absolute() else [path.parent / given, given, PROJECT_ROOT / given]
    for c in candidates:
        if file_status(c) is not None:
            return str(check_regular(c, raw, f"{where.path}: sweep.base", "run config").resolve())
    raise where(
        "base",
        f"no such run config {show(raw)} (looked beside the sweep file, in the current folder and in the project)",
    )


def _resolver(base, source: str):
    """overrides -> RunConfig for this sweep's points, reading a base config file once (a config resolved this
    way equals ``sim.config.run_config.resolve_config(base, overrides, source)``, which workers call)."""
    from sim.config.run_config import apply_override, config_from_dict
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    if isinstance(base, dict):
        raw = base
    else:
        try:
            raw = read_structured_file(Path(base), base, name_file=False)
        except ConfigError as exc:
            raise ConfigError(f"{source}: sweep.base", f"{exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(
                f"{source}: sweep.base", f"{show(base)} must hold a mapping of config fields, got {type(raw).__name__}"
            )
    where = source if isinstance(base, dict) else base
    policies, predictors = POLICIES.names(), PREDICTORS.names()

    def resolve(overrides: tuple[str, ...]):
        d = copy.deepcopy(raw)
        for o in overrides:
            apply_override(d, o)
        return config_from_dict(d, where, policies, predictors)

    return resolve


# --------------------------------------------------------------------------------------------- loading
def _read(path: Path, where) -> dict:
    if file_status(path) is None:
        raise ConfigError(str(path), "no such sweep file")
    d = read_structured_file(check_regular(path, str(path), str(path), "sweep file"), str(path), name_file=False)
    if not isinstance(d, dict):
        raise where("", "must hold a mapping with base and grid")
    for key in d:
        if key not in SWEEP_KEYS:
            raise where(_key_text(key), f"unknown key (known: {', '.join(SWEEP_KEYS)})")
    if "base" not in d:
        raise where("base", "missing: name the base run config")
    return d


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file, expand its points and resolve each (bad input -> ConfigError naming the file
    and the key; nothing is expanded before the number of points is known to be at most ``MAX_POINTS``)."""
    path = Path(path)
    where = _Where(path)
    d = _read(path, where)
    name = _name(d.get("name"), path, where)
    base = _base(d["base"], path, where)
    common = _optional_mapping(d, "set", where)
    if len(common) > MAX_SET_KEYS:
        raise where("set", f"has {len(common)} fields, more than {MAX_SET_KEYS}")
    for key, value in common.items():
        _check_field(key, where, "set")
        _check_value(value, MAX_SET_VALUE_CHARS, where, f"set.{key}")
    grid = _axes(_optional_mapping(d, "grid", where), where, "grid")
    groups = _zip_groups(d.get("zip"), where)
    swept = _sections(grid, groups)
    axes = [k for _, k in swept]
    if not axes:
        raise where("grid", "give at least one axis (grid or zip)")
    if len(axes) > MAX_AXES:
        raise where("grid", f"{len(axes)} swept fields, more than {MAX_AXES}")
    _check_overlaps(common, swept, where)
    checks = _checks(d.get("checks"), where)
    plots = _plots(d.get("plots"), axes, where)
    capacity = parse_capacity(d.get("capacity"), where)
    n = count_points(grid, groups)
    if n > MAX_POINTS:
        raise where("grid", f"the axes make more than {MAX_POINTS} points: split the sweep")
    points = _points(grid, groups, common, _resolver(base, str(path)), where, capacity)
    return Sweep(name, base, common, axes, points, checks, str(path), plots, capacity)


def _points(grid: dict, groups: list[dict], common: dict, resolve, where, capacity: dict | None = None) -> list[Point]:
    """Every point: the grid crossed with each zip group (a group is one axis of tuples), resolved and checked;
    points with the same resolved config are one point. With ``capacity``, a point's id covers the capacity
    settings too (a row found under other settings is not this point's)."""
    base_overrides = [_override(k, v) for k, v in common.items()]
    keys = list(grid) + [k for g in groups for k in g]
    group_rows = [list(zip(*g.values())) for g in groups]
    points, seen = [], set()
    for g in itertools.product(*grid.values()):
        for zs in itertools.product(*group_rows):
            fields = dict(zip(keys, list(g) + [v for z in zs for v in z]))
            overrides = tuple(base_overrides + [_override(k, v) for k, v in fields.items()])
            try:
                cfg = resolve(overrides)
            except DoesNotFit as exc:  # a point all the same: its row will say "does not fit (X GB > Y GB)"
                cfg = exc.config
            except ConfigError as exc:
                raise ConfigError(
                    f"{where.path}: {exc.field}" if exc.field else str(where.path),
                    f"{exc.problem} (sweep point {_fields_text(fields)})",
                ) from None
            ident = cfg.resolved if capacity is None else {"config": cfg.resolved, "capacity": capacity}
            pid = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
            if pid not in seen:
                seen.add(pid)
                points.append(Point(pid, fields, overrides))
    return points


def _fields_text(fields: dict, limit: int = 200) -> str:
    text = json.dumps(fields, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "MAX_POINTS",
    "Point",
    "SWEEP_KEYS",
    "Sweep",
    "count_points",
    "is_safe_name",
    "load_sweep",
    "safe_name",
]
