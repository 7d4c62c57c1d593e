"""Reading the files a user names (run configs, profiles, traces) without surprises: only regular files (a FIFO or
a device would block or never end), at most ``MAX_FILE_BYTES`` of YAML or JSON, no key given twice in a mapping,
no nesting deeper than the parser's stack, and every problem a one-line ConfigError naming the field or file."""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from moebase.checks import MAX_DEPTH, check_size, show
from moebase.errors import ConfigError
from moebase.outputs import note_input

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = PROJECT_ROOT / "configs"
MAX_FILE_BYTES = 4 << 20  # the largest config or profile file read (a config is a few KB)
_MERGE_TAG = "tag:yaml.org,2002:merge"


# --------------------------------------------------------------------------------------------- YAML and JSON
class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives a key twice (plain YAML keeps the last silently) and
    nesting deeper than ``MAX_DEPTH`` (the composer recurses, and its scanner slows down quadratically with depth).
    Keys merged in with ``<<`` may be overridden, as YAML intends."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH + 1:
                raise yaml.composer.ComposerError(
                    None, None, f"nests deeper than {MAX_DEPTH} levels", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the safe loader refuses it itself
                    continue
                if repeated:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {show(key)}",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep)


def _refuse_duplicates(pairs: list) -> dict:
    """A JSON object's pairs as a dict, refusing a key given twice."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {show(key)}")
        out[key] = value
    return out


def parse_text(text: str, json_format: bool = False) -> Any:
    """The value a YAML (or JSON) text holds, bounded in depth and size; raises ValueError with a one-line reason
    (and the line, where the parser knows it)."""
    try:
        if json_format:
            value = json.loads(text, object_pairs_hook=_refuse_duplicates)
        else:
            value = yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a safe loader)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {exc.lineno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        raise ValueError(f"{line}{getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise ValueError("nests too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. an int of 5000 digits, a date like 2020-13-01
        raise ValueError(str(exc) or type(exc).__name__) from None
    return value


# --------------------------------------------------------------------------------------------- paths
def file_status(path: Path) -> os.stat_result | None:
    """``os.stat`` of ``path``, or None when it cannot be looked at (missing, a name too long, a NUL byte...)."""
    try:
        return path.stat()
    except (OSError, ValueError):
        return None


def check_regular(path: Path, given: Any, where: str, what: str) -> Path:
    """``path`` itself if it is a regular file (following links), else ConfigError: a folder, a FIFO, a device."""
    st = file_status(path)
    if st is None:
        raise ConfigError(where, f"no such {what} {show(str(given))}")
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(where, f"{show(str(given))} is a folder, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(where, f"{show(str(given))} is not a regular file (a pipe or a device?), not a {what}")
    return path


#: While set (:func:`confined_to`): the folders and the single files that a path named inside a file may reach.
_CONFINEMENT: contextvars.ContextVar[tuple[tuple[Path, ...], frozenset[Path]] | None] = contextvars.ContextVar(
    "confinement", default=None
)


@contextlib.contextmanager
def confined_to(folders: Iterable[Path], files: Iterable[Path] = ()) -> Iterator[None]:
    """Within this block, every path that :func:`resolve_path` resolves must lie, links followed, inside one of
    ``folders`` or be one of ``files``. For files that came from elsewhere (a measurement archive): the paths they
    name must not reach the rest of the machine, where an error message could echo a file never meant to be read."""
    real_folders = tuple(Path(os.path.realpath(f)) for f in folders)
    real_files = frozenset(Path(os.path.realpath(f)) for f in files)
    token = _CONFINEMENT.set((real_folders, real_files))
    try:
        yield
    finally:
        _CONFINEMENT.reset(token)


def _outside(path: Path, given: Any, where: str, what: str) -> ConfigError | None:
    """None if no confinement is in force or ``path`` lies within it; else the error to raise (naming only the
    path, never what the file holds)."""
    rules = _CONFINEMENT.get()
    if rules is None:
        return None
    folders, files = rules
    real = Path(os.path.realpath(path))
    if real in files or any(real == f or f in real.parents for f in folders):
        return None
    return ConfigError(
        where,
        f"the {what} {show(str(given))} lies outside the folders this file may reference "
        f"({', '.join(str(f) for f in folders)})",
    )


def resolve_path(value: str | os.PathLike, where: str, what: str = "file") -> Path:
    """A user-given path to a regular file: as given if absolute, else the current folder first, then the project
    root."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(where, f"must be a path to a {what}, got {show(value)}")
    try:
        p = Path(value).expanduser()
    except (RuntimeError, ValueError):  # ~nosuchuser
        p = Path(value)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, PROJECT_ROOT / p]
    refused = None
    for c in candidates:
        if file_status(c) is not None:
            refused = _outside(check_regular(c, value, where, what), value, where, what)
            if refused is None:
                return c
    if refused is not None:
        raise refused
    folders = [] if p.is_absolute() else list(dict.fromkeys(str(x) for x in (Path.cwd(), PROJECT_ROOT)))
    looked = f" (looked in {' and '.join(folders)})" if folders else ""
    raise ConfigError(where, f"no such {what} {show(str(value))}{looked}")


def read_text(path: Path, where: str, name_file: bool = True, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes. Opens without blocking, so that a FIFO
    put in a file's place is refused rather than waited on."""
    it = f" {path}" if name_file else ""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as exc:
        raise ConfigError(where, f"cannot read{it} ({getattr(exc, 'strerror', None) or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise ConfigError(where, f"cannot read{it} (not a regular file)")
        note_input(fh.fileno(), path)
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise ConfigError(where, f"cannot read{it} ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise ConfigError(where, f"{path if name_file else 'the file'} is larger than {limit >> 20} MB: not a config")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(where, f"cannot read{it} ({exc.reason} at byte {exc.start}: not UTF-8 text)") from None


def read_structured_file(path: Path, where: str, name_file: bool = True) -> Any:
    """YAML (or JSON for ``.json``) content of ``path``, bounded in size and depth; errors name ``where`` (and the
    file, unless ``name_file`` is false because ``where`` is the file), on one line."""
    text = read_text(path, where, name_file)
    it = f"{path} is" if name_file else "is"
    is_json = path.suffix.lower() == ".json"
    try:
        value = parse_text(text, json_format=is_json)
    except ValueError as exc:
        raise ConfigError(where, f"{it} not valid {'JSON' if is_json else 'YAML'} ({exc})") from None
    try:
        return check_size(value, where)
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.problem + (f" (in {path})" if name_file else "")) from None


__all__ = [
    "CONFIG_DIR",
    "MAX_FILE_BYTES",
    "PROJECT_ROOT",
    "StrictLoader",
    "check_regular",
    "file_status",
    "confined_to",
    "parse_text",
    "read_structured_file",
    "read_text",
    "resolve_path",
]
