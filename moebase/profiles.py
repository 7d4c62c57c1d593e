"""Profile references: a model or hardware profile given by name (``configs/KIND/NAME.yaml``), by path (a YAML or
JSON file), or inline as a mapping, any of which may name a ``base`` profile whose fields it inherits and
overrides (``hardware: {base: h200, pcie_bw_gb_s: 25}``). This module turns a reference into the merged mapping;
:mod:`moebase.model` and :mod:`sim.config.hardware` check it."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moebase.checks import NAME_CHARS, check_mapping, join, kind_of, known_text, show
from moebase.errors import ConfigError, brief
from moebase.files import CONFIG_DIR, PROJECT_ROOT, file_status, read_structured_file, resolve_path

PROFILE_SUFFIXES = (".yaml", ".yml", ".json")
#: ``merge(base, child, where)``: a profile's mapping laid over its base's.
Merge = Callable[[dict, dict, str], dict]
MAX_BASE_DEPTH = 8  # base profiles chained deeper than this are refused (a cycle, most likely)


def available(kind: str) -> list[str]:
    """Names of the bundled profiles of ``kind`` ("models" or "hardware")."""
    folder = CONFIG_DIR / kind
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def is_path(text: str) -> bool:
    """Whether a profile reference is a path (it has a folder or a file suffix) rather than a bundled name."""
    return text.lower().endswith(PROFILE_SUFFIXES) or "/" in text or os.sep in text


def display(path: Path) -> str:
    """``path`` relative to the project root when it lies inside it."""
    try:
        return str(path.resolve().relative_to(PROJECT_ROOT))
    except (ValueError, OSError, RuntimeError):
        return str(path)


def _named_file(value: str, where: str, kind: str, singular: str) -> Path:
    """The file a reference names: a path, or a bundled profile's name."""
    if is_path(value):
        path = resolve_path(value, where, f"{singular} file")
        if path.suffix.lower() not in PROFILE_SUFFIXES:  # any other file would be parsed, its lines shown as keys
            raise ConfigError(
                where, f"{brief(value)} is not a {singular} file: a profile is a {'/'.join(PROFILE_SUFFIXES)} file"
            )
        return path
    st = file_status(CONFIG_DIR / kind / f"{value}.yaml") if len(value) <= NAME_CHARS else None
    if st is None or not stat.S_ISREG(st.st_mode):
        names = available(kind)
        raise ConfigError(
            where,
            f"unknown {singular} {brief(value)} ({known_text(value, names, f'configs/{kind}/')}; "
            "or give a path to a .yaml/.json file)",
        )
    return CONFIG_DIR / kind / f"{value}.yaml"


def load_profile(
    value: Any, where: str, kind: str, keys=(), depth: int = 0, merge: Merge | None = None
) -> tuple[dict, str]:
    """The mapping a profile reference stands for, with ``base`` references merged in, and its source (the file,
    or "inline"). ``kind`` is the folder under ``configs/`` ("models" or "hardware"). ``merge(base, child, where)``
    lays a profile over its base (default: the child's keys replace the base's; hardware profiles pass one that
    drops the figures of a part the child changes, ``sim.config.machine.merge_hardware``)."""
    if depth > MAX_BASE_DEPTH:
        raise ConfigError(join(where, "base"), f"nests more than {MAX_BASE_DEPTH} levels (a cycle?)")
    singular = "model" if kind == "models" else kind
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(where, f"must be a {singular} name, a path or a mapping, got ''")
        path = _named_file(value, where, kind, singular)
        source = display(path)
        d = read_structured_file(path, where)
        if not isinstance(d, dict):
            raise ConfigError(where, f"{source} must hold a mapping, got {kind_of(d)}")
        d = dict(check_mapping(d, where))
        if "base" not in d or kind == "systems":  # a system is named by its own file (llama-cpp, based on ideal)
            d.setdefault("name", path.stem)  # others, with a base, by the base's (a calibration of h200 is h200)
    elif isinstance(value, dict):
        d, source = dict(check_mapping(value, where)), "inline"
    else:
        raise ConfigError(where, f"must be a {singular} name, a path or a mapping, got {show(value)}")
    if "base" in d:
        base = d.pop("base")
        if not isinstance(base, str):
            raise ConfigError(join(where, "base"), f"must be a {singular} name or path, got {show(base)}")
        try:
            merged, base_source = load_profile(base, join(where, "base"), kind, keys, depth + 1, merge)
        except ConfigError as exc:
            if source == "inline" or source in exc.problem:
                raise
            raise ConfigError(exc.field, f"{exc.problem} (in {source})") from None
        if source == "inline" and kind == "hardware" and "source" not in d:
            d["source"] = f"{base_source} (modified inline)" if len(d) > ("name" in d) else base_source
        try:
            merged = merge(merged, d, where) if merge is not None else {**merged, **d}
        except ConfigError as exc:
            if source == "inline":
                raise
            raise ConfigError(exc.field, f"{exc.problem} (in {source})") from None
        if source != "inline" and kind == "hardware":
            merged["source"] = source
        d = merged
    elif source != "inline" and kind == "hardware":
        d.setdefault("source", source)
    return d, source


__all__ = ["PROFILE_SUFFIXES", "available", "display", "is_path", "load_profile"]
