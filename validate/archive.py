"""Measurement archives (``gpu-check.tar.gz`` from ``run_gpu_check.sh --pack``) and measurement folders as
untrusted input: what they may hold, and how compare reads them without leaving the folder.

An archive is one top folder holding ``manifest.json``, made of regular files and folders only: no link of any
kind (a chain of links, each harmless when checked alone, can point anywhere once all exist), no device, FIFO or
sparse member, no name that is absolute, holds ``..`` or leaves the top folder, and bounded in member count,
member size and total size. The whole compressed stream is read first (so a bad gzip checksum or a cut archive is
refused before anything is used) into a private temporary folder beside the archive; the members are written there
by this module, not by tarfile, and the folder takes its final name only when complete. Every failure removes what
was written.

Inside a measurement folder, every file compare reads or writes is reached through real folders only (no link on
the way), must stay inside the folder, and must be a regular file: a FIFO, a device or a folder in a file's place
is refused rather than waited on or read forever.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from sim.config.checks import show
from sim.config.files import read_structured_file
from sim.errors import ConfigError
from traces.io import file_kind

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")

#: The most members an archive may hold (a real measurement archive holds about 90: 8 configurations x 11 files).
MAX_MEMBERS = 10_000
#: The largest member (the largest real one, a decisions.json, is under 200 KB).
MAX_MEMBER_BYTES = 256 << 20
#: The most an archive may unpack to, all members together (real archives: about 1 MB).
MAX_TOTAL_BYTES = 1 << 30
#: The longest member name, and the longest single part of it (a file system's own limit is 255 bytes).
MAX_NAME_CHARS = 1024
MAX_PART_BYTES = 255
#: A file beside the unpacked folder's content saying which archive it came from, so that another archive of the
#: same name is not silently answered with the old content.
ORIGIN_FILE = ".unpacked-from.json"
#: The longest plain name (a configuration in a manifest: ``diffmoe-arc-b32-c13``).
MAX_PLAIN_NAME_CHARS = 100
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@,-]*")
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"


# --------------------------------------------------------------------------------------------- names
def plain_name(value: Any, where: str) -> str:
    """``value`` as the name of one entry of a folder: a non-empty string of letters, digits and ``._+=@,-``,
    starting with a letter or digit, at most ``MAX_PLAIN_NAME_CHARS`` long (so never ``..``, a path or a flag)."""
    if not isinstance(value, str):
        raise ConfigError(where, f"must be a name (a string), got {show(value)}")
    if not value or len(value) > MAX_PLAIN_NAME_CHARS or not _PLAIN_NAME.fullmatch(value):
        raise ConfigError(
            where,
            f"must be a plain name (letters, digits and ._+=@,- , at most "
            f"{MAX_PLAIN_NAME_CHARS} characters, no '/' or '..'), got {show(value)}",
        )
    return value


def archive_target(archive: Path) -> Path:
    """The folder ``archive`` unpacks to: beside it, under its name without the suffix."""
    name = archive.name
    for suffix in ARCHIVE_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return archive.parent / name[: -len(suffix)]
    raise ConfigError(str(archive), f"is not named like a measurement archive ({', '.join(ARCHIVE_SUFFIXES)})")


def _member_parts(name: str, archive: Path) -> list[str]:
    """The parts of a member's name, refused unless it is a plain relative path: not absolute, no ``..``, ``.`` or
    empty part, printable, bounded."""

    def refuse(why: str):
        raise ConfigError(str(archive), f"member {show(name)}: {why}: refused")

    if not name:
        refuse("has an empty name")
    if len(name) > MAX_NAME_CHARS:
        refuse(f"has a name longer than {MAX_NAME_CHARS} characters")
    if name.startswith("/") or re.match(r"[A-Za-z]:[\\/]", name) or name.startswith("\\"):
        refuse("has an absolute name")
    if not name.isprintable():
        refuse("has control characters in its name")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        refuse("has a name that is not UTF-8")
    parts = name.rstrip("/").split("/")
    if any(p == ".." for p in parts):
        refuse("has '..' in its name (it would leave the folder)")
    if any(p in ("", ".") for p in parts):
        refuse("has an empty or '.' part in its name")
    if any(len(p.encode("utf-8")) > MAX_PART_BYTES for p in parts):
        refuse(f"has a name part longer than {MAX_PART_BYTES} bytes")
    return parts


def _member_kind(m: tarfile.TarInfo) -> str | None:
    """What is wrong with a member's type, or None for a regular file or a folder."""
    if m.issym():
        return "is a symbolic link"
    if m.islnk():
        return "is a hard link"
    if m.ischr() or m.isblk():
        return "is a device"
    if m.isfifo():
        return "is a FIFO"
    if m.issparse():
        return "is a sparse file"
    if m.isreg() or m.isdir():
        return None
    return f"is not a regular file or folder (tar type {show(m.type)})"


# --------------------------------------------------------------------------------------------- unpacking
def _open_archive(archive: Path) -> IO[bytes]:
    """``archive`` opened for reading, if it is a regular file (without blocking on a FIFO)."""
    try:
        fd = os.open(archive, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ConfigError(str(archive), "no such file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(str(archive), f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    f = os.fdopen(fd, "rb")
    mode = os.fstat(f.fileno()).st_mode
    if not stat.S_ISREG(mode):
        f.close()
        raise ConfigError(str(archive), f"is {file_kind(archive)}, not an archive file")
    return f


class _Hashing:
    """A file read through, its bytes counted into a SHA-256 (the archive's identity)."""

    def __init__(self, f: IO[bytes]):
        self.f, self.sha = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha.update(data)
        return data

    def seek(self, n: int) -> int:
        """Refused: every byte is hashed once, in order (gzip reading forward never seeks its file)."""
        raise io.UnsupportedOperation("an archive is hashed as it is read: it cannot seek")


def stream_limit() -> int:
    """The most bytes an archive's tar stream may hold: the members, plus their headers and padding."""
    return MAX_TOTAL_BYTES + 4096 * MAX_MEMBERS + (1 << 20)


def _copy_stream(archive: Path, dest: Path) -> str:
    """Decompress ``archive`` (gzip, or a plain tar) whole into ``dest``, bounded by :func:`stream_limit`; the
    gzip checksum and length are checked at its end. Returns the archive's SHA-256."""
    limit = stream_limit()
    with _open_archive(archive) as raw:
        head = raw.read(2)
        raw.seek(0)
        src = _Hashing(raw)
        stream: Any = gzip.GzipFile(fileobj=src, mode="rb") if head == _GZIP_MAGIC else src
        written = 0
        with open(dest, "wb") as out:
            while True:
                try:
                    block = stream.read(_CHUNK)
                except (gzip.BadGzipFile, zlib.error) as exc:
                    raise ConfigError(str(archive), f"is a damaged gzip stream ({exc}): refused") from None
                except EOFError:
                    raise ConfigError(
                        str(archive), "is cut short (the gzip stream ends before its end marker): refused"
                    ) from None
                if not block:
                    break
                written += len(block)
                if written > limit:
                    raise ConfigError(
                        str(archive),
                        f"unpacks to more than {limit >> 20} MB: refused (a measurement "
                        f"archive holds at most {MAX_TOTAL_BYTES >> 20} MB)",
                    )
                out.write(block)
        return src.sha.hexdigest()


def _check_members(tar: tarfile.TarFile, archive: Path) -> tuple[str, list[tuple[tarfile.TarInfo, list[str]]]]:
    """The archive's top folder and its members (each with its name's parts below the top), every rule checked
    before anything is written."""
    members: list[tuple[tarfile.TarInfo, list[str]]] = []
    top: str | None = None
    total = 0
    files: set[tuple[str, ...]] = set()
    dirs: set[tuple[str, ...]] = set()
    for m in tar:
        if len(members) >= MAX_MEMBERS:
            raise ConfigError(str(archive), f"holds more than {MAX_MEMBERS} members: refused")
        kind = _member_kind(m)
        if kind is not None:
            raise ConfigError(
                str(archive),
                f"member {show(m.name)} {kind}: refused (a measurement archive holds only regular files and folders)",
            )
        parts = _member_parts(m.name, archive)
        if top is None:
            top = parts[0]
        elif parts[0] != top:
            raise ConfigError(
                str(archive),
                f"member {show(m.name)} is outside the top folder {show(top)}: refused "
                "(a measurement archive is one folder)",
            )
        rel = tuple(parts[1:])
        if not rel:
            if not m.isdir():
                raise ConfigError(str(archive), f"member {show(m.name)}: the top folder is not a folder: refused")
            continue
        if m.isreg():
            if m.size < 0 or m.size > MAX_MEMBER_BYTES:
                raise ConfigError(
                    str(archive),
                    f"member {show(m.name)} holds {m.size} bytes, more than {MAX_MEMBER_BYTES >> 20} MB: refused",
                )
            total += m.size
            if total > MAX_TOTAL_BYTES:
                raise ConfigError(str(archive), f"unpacks to more than {MAX_TOTAL_BYTES >> 20} MB: refused")
        for i in range(1, len(rel)):
            if rel[:i] in files:
                raise ConfigError(str(archive), f"member {show(m.name)} is inside a file: refused")
            dirs.add(rel[:i])
        if rel in files or (m.isreg() and rel in dirs):
            raise ConfigError(str(archive), f"member {show(m.name)} is given twice: refused")
        (files if m.isreg() else dirs).add(rel)
        members.append((m, list(rel)))
    if top is None:
        raise ConfigError(str(archive), "is empty: not a measurement archive")
    if ("manifest.json",) not in files:
        raise ConfigError(str(archive), "is not a measurement archive (one folder holding manifest.json)")
    return top, members


def _check_end(tar: tarfile.TarFile, stream: Path, archive: Path) -> None:
    """Refuse a tar stream with anything but zeros after the point where tarfile stopped reading: tarfile ends an
    archive silently at a damaged header, which would drop the members after it."""
    with open(stream, "rb") as f:
        f.seek(tar.offset)
        for block in iter(lambda: f.read(_CHUNK), b""):
            if block.strip(b"\0"):
                raise ConfigError(str(archive), "holds a damaged tar header (or data after the archive's end): refused")


def _write_members(tar: tarfile.TarFile, members: list, root: Path, archive: Path) -> None:
    """Write the checked members under the new, private folder ``root``: folders made one part at a time, files
    created anew (never opened through a link), each holding exactly its declared size."""
    made: set[tuple[str, ...]] = set()
    for m, rel in members:
        folder_parts = rel if m.isdir() else rel[:-1]
        for i in range(1, len(folder_parts) + 1):
            if tuple(folder_parts[:i]) not in made:
                os.mkdir(root.joinpath(*folder_parts[:i]), 0o755)
                made.add(tuple(folder_parts[:i]))
        if m.isdir():
            continue
        src = tar.extractfile(m)
        if src is None:
            raise ConfigError(str(archive), f"member {show(m.name)} cannot be read: refused")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with src, os.fdopen(os.open(root.joinpath(*rel), flags, 0o644), "wb") as out:
            left = m.size
            while left > 0:
                block = src.read(min(_CHUNK, left))
                if not block:
                    raise ConfigError(str(archive), f"member {show(m.name)} is cut short: refused")
                out.write(block)
                left -= len(block)


def _origin(archive: Path, sha: str) -> dict:
    return {"archive": archive.name, "sha256": sha}


def unpack(archive: str | os.PathLike, log: Callable[[str], Any] = print) -> Path:
    """The measurement folder inside ``archive``, unpacked beside it under its name without the suffix
    (``gpu-check.tar.gz`` -> ``gpu-check/``). An existing folder of that name is used as it is when it is a real
    folder (not a link) unpacked from this very archive, or made some other way (then compare reads it under the
    same rules as any folder); one unpacked from another archive of the same name is refused."""
    archive = Path(archive)
    target = archive_target(archive)
    _open_archive(archive).close()  # a regular file, there: refused first, whatever lies beside it
    existing = os.path.lexists(target)
    work = None
    try:
        if existing:
            return _reuse(archive, target, log)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name[:80]}.unpack-", dir=archive.parent))
        stream, root = work / "stream.tar", work / "folder"
        sha = _copy_stream(archive, stream)
        try:
            with tarfile.open(stream, "r:") as tar:
                _, members = _check_members(tar, archive)
                _check_end(tar, stream, archive)
                os.mkdir(root, 0o755)
                _write_members(tar, members, root, archive)
        except (tarfile.TarError, EOFError, UnicodeError) as exc:
            raise ConfigError(
                str(archive), f"is not a readable tar archive ({exc.__class__.__name__}: {exc}): refused"
            ) from None
        (root / ORIGIN_FILE).write_text(json.dumps(_origin(archive, sha)) + "\n")
        os.rename(root, target)  # the same file system; fails rather than merge into a folder made meanwhile
    except OSError as exc:
        raise ConfigError(
            str(archive), f"cannot be unpacked ({exc.__class__.__name__}: {exc.strerror or exc})"
        ) from None
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    log(f"unpacked {archive.name} into {target}/")
    return target


def _reuse(archive: Path, target: Path, log: Callable[[str], Any]) -> Path:
    """``target``, already there: a real folder, from this archive (or of unknown origin)."""
    st = os.lstat(target)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            str(target), f"is a link: refusing to read or write through it (remove it to unpack {archive.name})"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(str(target), f"is {file_kind(target)}, not a folder: cannot unpack {archive.name} there")
    origin_path = target / ORIGIN_FILE
    if os.path.lexists(origin_path):
        origin = read_structured_file(regular_file(target, ORIGIN_FILE), str(origin_path), name_file=False)
        with _open_archive(archive) as f:
            sha = hashlib.sha256()
            for block in iter(lambda: f.read(_CHUNK), b""):
                sha.update(block)
        if not isinstance(origin, dict) or origin.get("sha256") != sha.hexdigest():
            raise ConfigError(
                str(target),
                f"was unpacked from another {archive.name} (its checksum differs): "
                "remove the folder to unpack this one",
            )
    log(f"using {target}/ (already unpacked from {archive.name})")
    return target


# --------------------------------------------------------------------------------------------- reading inside
def _walk(folder: Path, rel: str | os.PathLike) -> tuple[Path, os.stat_result | None]:
    """``folder / rel`` and its ``lstat`` (None when missing), refused when a part of ``rel`` is absolute or
    ``..``, when any part on the way is a link, or when a part before the last is not a folder."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or any(p in ("..", ".") for p in parts):
        raise ConfigError(str(folder / rel), "is not a path inside the measurement folder: refused")
    path = folder
    st = None
    for i, part in enumerate(parts):
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return folder.joinpath(*parts), None
        except (OSError, ValueError) as exc:
            raise ConfigError(str(path), f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
        if stat.S_ISLNK(st.st_mode):
            raise ConfigError(str(path), "is a link: refused (a measurement folder holds only files and folders)")
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise ConfigError(str(path), f"is {file_kind(path)}, not a folder")
    return path, st


def _inside(folder: Path, path: Path) -> None:
    """Refuse ``path`` unless it resolves inside ``folder`` (a last guard: the walk has seen no link)."""
    real_folder, real = os.path.realpath(folder), os.path.realpath(path)
    if os.path.commonpath([real_folder, real]) != real_folder:
        raise ConfigError(str(path), "resolves outside the measurement folder: refused")


def find_file(folder: Path, rel: str | os.PathLike) -> Path | None:
    """``folder / rel`` if it exists (checked as :func:`regular_file` checks it), None if it is missing."""
    path, st = _walk(folder, rel)
    if st is None:
        return None
    return regular_file(folder, rel)


def regular_file(folder: Path, rel: str | os.PathLike, what: str = "") -> Path:
    """``folder / rel``, a regular file inside ``folder`` reached through real folders only; missing, a link on
    the way, a folder, a FIFO or a device in its place is a ConfigError naming it."""
    path, st = _walk(folder, rel)
    if st is None:
        raise ConfigError(str(path), f"missing{': ' + what if what else ''}")
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(str(path), "is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(str(path), f"is {file_kind(path)}, not a regular file: refused")
    _inside(folder, path)
    return path


def output_folder(folder: Path, rel: str = "compare", make: bool = True) -> Path:
    """``folder / rel`` as the folder compare writes into: missing (made here, if ``make``) or a real folder inside
    ``folder``; a link (``compare -> ..``), a file, a FIFO in its place is refused before anything is written."""
    path, st = _walk(folder, rel)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise ConfigError(str(path), f"is {file_kind(path)}, not a folder: cannot write the comparison there")
    if st is None and make:
        try:
            os.mkdir(path, 0o755)
        except OSError as exc:
            raise ConfigError(str(path), f"cannot be made ({exc.strerror or exc})") from None
    if make:
        _walk(folder, rel)  # still a real folder once made
        _inside(folder, path)
    return path


def output_file(folder: Path, rel: str | os.PathLike) -> Path:
    """``folder / rel`` as a file compare (re)writes: missing, or a regular file reached through real folders."""
    path, st = _walk(folder, rel)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigError(str(path), f"is {file_kind(path)}, not a regular file: refusing to replace it")
    return path


def read_inside(folder: Path, rel: str | os.PathLike, what: str = "") -> Any:
    """The JSON or YAML content of the regular file ``folder / rel`` (bounded in size and depth, never through a
    link, never outside ``folder``)."""
    path = regular_file(folder, rel, what)
    return read_structured_file(path, str(path), name_file=False)


__all__ = [
    "ARCHIVE_SUFFIXES",
    "MAX_MEMBERS",
    "MAX_MEMBER_BYTES",
    "MAX_TOTAL_BYTES",
    "ORIGIN_FILE",
    "archive_target",
    "find_file",
    "output_file",
    "output_folder",
    "plain_name",
    "read_inside",
    "regular_file",
    "unpack",
]
