"""The sweep file: its keys, and its expansion into points (one resolved run config each).

A sweep file names a base run config, overrides for every point (``set``), and the axes to vary (``grid``: a
cartesian product; ``zip``: axes varied together). Each point is identified by a hash of its resolved config, so
the same point in two sweeps (or two runs of one sweep) has the same id.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from sim.errors import ConfigError
from sim.files import check_regular, file_status, read_structured_file
from sim.sweep_checks import CHECKS

SWEEP_KEYS = {"base", "set", "grid", "zip", "checks", "name", "plots"}


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
    base: object            # path (str) of the base run config, or an inline mapping
    common: dict            # overrides for every point
    axes: list[str]
    points: list[Point]
    checks: list[str]
    source: str
    plots: list[str] | None = None   # x axes of the throughput plots (None: every numeric swept axis)


def _override(key: str, value) -> str:
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def resolve_config(base, overrides: tuple[str, ...], source: str):
    """The run config of a point: ``base`` (a path or an inline mapping) with ``overrides`` (bad -> ConfigError)."""
    from sim.config import apply_override, config_from_dict, load_run_config
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    if isinstance(base, dict):
        raw = copy.deepcopy(base)
        for o in overrides:
            apply_override(raw, o)
        return config_from_dict(raw, source, POLICIES.names(), PREDICTORS.names())
    return load_run_config(base, overrides, POLICIES.names(), PREDICTORS.names())


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file, expand its points and resolve each (bad input -> ConfigError)."""
    path = Path(path)
    if file_status(path) is None:
        raise ConfigError(str(path), "no such sweep file")
    d = read_structured_file(check_regular(path, str(path), str(path), "sweep file"), str(path), name_file=False)
    if not isinstance(d, dict):
        raise ConfigError(str(path), "must hold a mapping with base and grid")
    unknown = sorted(set(d) - SWEEP_KEYS)
    if unknown:
        raise ConfigError(f"sweep.{unknown[0]}", f"unknown key (known: {', '.join(sorted(SWEEP_KEYS))})")
    if "base" not in d:
        raise ConfigError("sweep.base", "missing: name the base run config")
    base = d["base"]
    if isinstance(base, str):
        base_path = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        base = str(base_path.resolve() if base_path.exists() else base)  # absolute: workers may run elsewhere
    elif not isinstance(base, dict):
        raise ConfigError("sweep.base", "must be a path to a run config or an inline mapping")
    common = d.get("set") or {}
    grid = d.get("grid") or {}
    groups = d.get("zip") or []
    groups = [groups] if isinstance(groups, dict) else groups
    if not isinstance(groups, list):
        raise ConfigError("sweep.zip", "must be a mapping of zipped axes, or a list of such mappings")
    for name, axes in [("set", common), ("grid", grid)] + [(f"zip[{i}]", g) for i, g in enumerate(groups)]:
        if not isinstance(axes, dict):
            raise ConfigError(f"sweep.{name}", "must be a mapping of config field -> value(s)")
    for name, axes in [("grid", grid)] + [("zip" if len(groups) == 1 else f"zip[{i}]", g) for i, g in enumerate(groups)]:
        for key, values in axes.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"sweep.{name}.{key}", "must be a non-empty list of values")
        if name.startswith("zip") and len({len(v) for v in axes.values()}) > 1:
            raise ConfigError(f"sweep.{name}", "every zipped axis needs the same number of values")
    if not grid and not groups:
        raise ConfigError("sweep.grid", "give at least one axis (grid or zip)")
    plots = d.get("plots")
    if plots is not None and (not isinstance(plots, list) or not all(isinstance(x, str) for x in plots)):
        raise ConfigError("sweep.plots", "must list swept fields (or cache_slots) to plot throughput against")
    checks = d.get("checks") or []
    for c in checks:
        if c not in CHECKS:
            raise ConfigError("sweep.checks", f"unknown check {c!r} (known: {', '.join(CHECKS)})")
    base_overrides = [_override(k, v) for k, v in common.items()]
    grid_keys = list(grid)
    zip_keys = [k for g in groups for k in g]
    # each zip group is one axis of tuples; the groups and the grid axes are crossed
    group_rows = [list(zip(*g.values())) for g in groups]
    combos = []
    for g in itertools.product(*grid.values()) if grid else [()]:
        for zs in itertools.product(*group_rows) if group_rows else [()]:
            values = list(g) + [v for z in zs for v in z]
            combos.append(dict(zip(grid_keys + zip_keys, values)))
    points, seen = [], set()
    for fields in combos:
        overrides = tuple(base_overrides + [_override(k, v) for k, v in fields.items()])
        try:
            cfg = resolve_config(base, overrides, str(path))
        except ConfigError as exc:
            raise ConfigError(f"{exc} (sweep point {json.dumps(fields)})") from None
        pid = hashlib.sha256(json.dumps(cfg.resolved, sort_keys=True, default=str).encode()).hexdigest()[:16]
        if pid in seen:
            continue
        seen.add(pid)
        points.append(Point(pid, fields, overrides))
    for x in plots or []:
        if x not in grid_keys + zip_keys + ["cache_slots"]:
            raise ConfigError("sweep.plots", f"{x!r} is not a swept field (nor cache_slots)")
    return Sweep(d.get("name") or path.stem, base, common, grid_keys + zip_keys, points, list(checks), str(path),
                 plots)
