"""Measurement archives (``gpu-check.tar.gz`` from ``run_gpu_check.sh --pack``) and measurement folders as
untrusted input: what they may hold, and how compare reads them without leaving the folder.

An archive is one top folder holding ``manifest.json``, made of regular files and folders only: no link of any
kind (a chain of links, each harmless when checked alone, can point anywhere once all exist), no device, FIFO or
sparse member, no name that is absolute, holds ``..`` or leaves the top folder, and bounded in member count,
member size and total size. The whole compressed stream is read first (so a bad gzip checksum or a cut archive is
refused before anything is used) into a private temporary folder beside the archive; the members are written there
by this module, not by tarfile, and the folder takes its final name only when complete. Every failure removes what
was written. Before tarfile parses anything, every raw tar header is read here (checksum, number fields, sizes,
pax records; :class:`_HeaderScan`), so no header can make tarfile hang or allocate what it claims. The folder's
name is the archive's without its suffix and must be a plain name (never ``..``); concurrent unpacks of one
archive take turns on a lock file beside it (``.NAME.lock``), and the later ones use the complete folder.

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
from typing import IO, Any, NoReturn

from moebase.checks import show
from moebase.errors import ConfigError
from moebase.files import read_structured_file
from traces.io import file_kind
from traces.locks import held_lock

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
#: The largest pax header (tar types 'x', 'g'), GNU long name or link ('L', 'K'), or data of any other header that
#: is not a member: real ones hold one name of at most MAX_NAME_CHARS and a few times (under 2 KB). Python 3.11.7's
#: tarfile reads a pax header in time quadratic in its runs of digits: 8 KiB takes about 0.1 s on the 2-core VM,
#: 32 KiB about 1.2 s.
MAX_EXTENDED_HEADER_BYTES = 8 << 10
#: The most digits of a pax record's length (enough for a record as long as MAX_EXTENDED_HEADER_BYTES).
MAX_PAX_LENGTH_DIGITS = len(str(MAX_EXTENDED_HEADER_BYTES))
#: The most digits of a number a pax header gives for a member's size (MAX_MEMBER_BYTES has 9).
MAX_PAX_SIZE_DIGITS = 12
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_BLOCK = 512
_OCTAL = re.compile(rb"[0-7]*")
_PAX_RECORD = re.compile(rb"([1-9][0-9]{0,%d}) ([^=\n]+)=" % (MAX_PAX_LENGTH_DIGITS - 1))
#: tar types as tarfile reads them: extended headers (each applies to the member after it), members whose data
#: it skips, and members whose size it ignores (their data, if any, is read as the next header).
_PAX_TYPES = (b"x", b"g", b"X")
_EXTENDED_TYPES = (*_PAX_TYPES, b"L", b"K")
_REGULAR_TYPES = (b"0", b"\0", b"7")
_NO_DATA_TYPES = (b"1", b"2", b"3", b"4", b"5", b"6")
#: The header fields tarfile reads as numbers: (name, start, end).
_NUMBER_FIELDS = (
    ("mode", 100, 108),
    ("uid", 108, 116),
    ("gid", 116, 124),
    ("size", 124, 136),
    ("mtime", 136, 148),
    ("devmajor", 329, 337),
    ("devminor", 337, 345),
)


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
    """The folder ``archive`` unpacks to: beside it, under its name without the suffix, which must be a plain
    name (so never ``..`` or ``.``, whatever the archive is called)."""
    name = archive.name
    suffix = next((x for x in ARCHIVE_SUFFIXES if name.endswith(x)), None)
    if suffix is None:
        raise ConfigError(str(archive), f"is not named like a measurement archive ({', '.join(ARCHIVE_SUFFIXES)})")
    stem = name[: -len(suffix)]
    if len(stem) > MAX_PLAIN_NAME_CHARS or not _PLAIN_NAME.fullmatch(stem):
        raise ConfigError(
            str(archive),
            f"cannot be unpacked: the folder it unpacks to, its name without {suffix}, must be a plain name "
            f"(letters, digits and ._+=@,- starting with a letter or digit, at most {MAX_PLAIN_NAME_CHARS} "
            f"characters), got {show(stem)}: refused",
        )
    return archive.parent / stem


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


# --------------------------------------------------------------------------------------------- raw tar headers
def _number(field: bytes) -> int | None:
    """A tar header's number field: octal digits (ended by NUL, padded by spaces) or GNU base-256 (lead byte
    0x80, or 0xff for a negative number); None when it is neither."""
    if field[:1] in (b"\x80", b"\xff"):
        n = int.from_bytes(field[1:], "big")
        return n - (1 << (8 * (len(field) - 1))) if field[0] == 0xFF else n
    digits = field.split(b"\0", 1)[0].strip(b" ")
    return int(digits or b"0", 8) if _OCTAL.fullmatch(digits) else None


def _checksum_holds(block: bytes) -> bool:
    """Whether a header block's checksum field is the sum of its bytes (its own field as spaces), unsigned or
    signed, as tar defines it (and tarfile accepts)."""
    rest = block[:148] + b" " * 8 + block[156:]
    unsigned = sum(rest)
    signed = unsigned - 256 * sum(1 for b in rest if b >= 0x80)
    return _number(block[148:156]) in (unsigned, signed)


def _text(raw: bytes) -> str:
    """A name field as tarfile decodes it: up to its first NUL, undecodable bytes kept as surrogates."""
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


class _HeaderScan:
    """The tar stream's headers read one by one as tarfile will read them, each checked before tarfile parses
    any: a damaged, negative, oversized or malformed header is refused here, never handed to tarfile."""

    def __init__(self, f: IO[bytes], length: int, archive: Path):
        self.f, self.length, self.archive = f, length, archive
        self.chain: set[bytes] = set()  # the extended headers read since the last member ('X' counted as 'x')
        self.pax: dict[str, str] = {}  # the records of the pax header before the next member
        self.long_name: str | None = None  # the GNU long name before the next member
        self.members = 0

    def refuse(self, offset: int, why: str) -> NoReturn:
        raise ConfigError(str(self.archive), f"tar header at byte {offset}: {why}: refused")

    def run(self) -> None:
        """Read every header up to the end-of-archive block."""
        while True:
            offset = self.f.tell()
            block = self.f.read(_BLOCK)
            if len(block) < _BLOCK:
                self.refuse(offset, "the stream ends inside a header" if block else "no end-of-archive block")
            if not block.strip(b"\0"):
                if self.chain:
                    self.refuse(offset, "an extended header is followed by no member")
                return
            self.header(block, offset)

    def header(self, block: bytes, offset: int) -> None:
        """Check one header block and move past its data."""
        if not _checksum_holds(block):
            raise ConfigError(
                str(self.archive), f"holds a damaged tar header at byte {offset} (its checksum does not hold): refused"
            )
        numbers = {name: _number(block[a:b]) for name, a, b in _NUMBER_FIELDS}
        bad = [name for name, n in numbers.items() if n is None]
        if bad:
            self.refuse(offset, f"its {bad[0]} field is not a number")
        kind, size = block[156:157], numbers["size"]
        assert size is not None
        if kind in _EXTENDED_TYPES:
            self.extended(kind, size, offset)
        else:
            self.member(block, kind, size, offset)

    def data(self, size: int, offset: int, what: str) -> bytes:
        """The ``size`` bytes after the header at ``offset`` and their padding, which must be zeros."""
        raw = self.f.read(-(-size // _BLOCK) * _BLOCK)
        if len(raw) < -(-size // _BLOCK) * _BLOCK:
            self.refuse(offset, f"the stream ends inside {what}")
        if raw[size:].strip(b"\0"):
            self.refuse(offset, f"{what} is padded with other bytes than zeros")
        return raw[:size]

    def extended(self, kind: bytes, size: int, offset: int) -> None:
        """A pax header or GNU long name or link: bounded, once each before a member, its records well formed."""
        what = f"the extended header (tar type {show(kind.decode('latin-1'))})"
        if size < 0 or size > MAX_EXTENDED_HEADER_BYTES:
            self.refuse(offset, f"{what} claims {size} bytes (at most {MAX_EXTENDED_HEADER_BYTES} are allowed)")
        once = b"x" if kind == b"X" else kind
        if once in self.chain:
            self.refuse(offset, f"{what} is given twice for one member")
        self.chain.add(once)
        data = self.data(size, offset, what)
        if kind == b"L":
            self.long_name = _text(data)
        elif kind in _PAX_TYPES:
            records = self.records(data, offset, what)
            if kind == b"g" and "size" in records:
                self.refuse(offset, f"{what} sets the size of every member")
            if kind != b"g":
                self.pax = records

    def records(self, data: bytes, offset: int, what: str) -> dict[str, str]:
        """The records of a pax header, each ``LEN KEY=VALUE\\n`` with LEN plain decimal digits counting the whole
        record, filling the header exactly, in UTF-8."""
        records: dict[str, str] = {}
        pos = 0
        while pos < len(data):
            m = _PAX_RECORD.match(data, pos)
            end = pos + int(m.group(1)) if m else 0
            if m is None or end > len(data) or end <= m.end() or data[end - 1 : end] != b"\n":
                self.refuse(offset, f"{what} holds a malformed record at its byte {pos}")
            try:
                key, value = m.group(2).decode("utf-8"), data[m.end() : end - 1].decode("utf-8")
            except UnicodeDecodeError:
                self.refuse(offset, f"{what} holds a record that is not UTF-8")
            if "\n" in value:
                self.refuse(offset, f"{what} holds a record of several lines")
            if key.startswith("GNU.sparse."):
                self.refuse(offset, f"{what} describes a sparse file (a measurement archive holds none)")
            if key == "size" and not (value.isascii() and value.isdigit() and len(value) <= MAX_PAX_SIZE_DIGITS):
                self.refuse(offset, f"{what} gives a size that is not a number of at most {MAX_PAX_SIZE_DIGITS} digits")
            records[key] = value
            pos = end
        return records

    def name(self, block: bytes) -> str:
        """The member's name as tarfile will see it (for messages): a pax path, a GNU long name, or the header's
        name after its ustar prefix."""
        if "path" in self.pax:
            return self.pax["path"]
        if self.long_name is not None:
            return self.long_name
        name, prefix = _text(block[:100]), _text(block[345:500])
        return f"{prefix}/{name}" if prefix else name

    def member(self, block: bytes, kind: bytes, size: int, offset: int) -> None:
        """A member's header: counted, its size (and a pax header's for it) bounded, its data skipped."""
        name = self.name(block)
        if kind == b"S":
            self.refuse(offset, f"member {show(name)} is a sparse file (a measurement archive holds none)")
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise ConfigError(str(self.archive), f"holds more than {MAX_MEMBERS} members: refused")
        self.bounded(name, size, offset)
        size = int(self.pax.get("size", size))
        self.bounded(name, size, offset)
        self.chain, self.pax, self.long_name = set(), {}, None
        v7_folder = kind == b"\0" and block[:100].split(b"\0", 1)[0].endswith(b"/")
        if kind in _NO_DATA_TYPES or v7_folder:
            return  # tarfile reads the next header right after this one, whatever the size says
        if kind not in _REGULAR_TYPES and size > MAX_EXTENDED_HEADER_BYTES:
            self.refuse(offset, f"member {show(name)} of tar type {show(kind.decode('latin-1'))} claims {size} bytes")
        end = offset + _BLOCK + -(-size // _BLOCK) * _BLOCK
        if end > self.length:
            self.refuse(offset, f"the stream ends inside the data of member {show(name)}")
        self.f.seek(end)

    def bounded(self, name: str, size: int, offset: int) -> None:
        """Refuse a member's size below 0 or above ``MAX_MEMBER_BYTES``."""
        if size < 0:
            self.refuse(offset, f"member {show(name)} has a negative size ({size})")
        if size > MAX_MEMBER_BYTES:
            raise ConfigError(
                str(self.archive),
                f"member {show(name)} holds {size} bytes, more than {MAX_MEMBER_BYTES >> 20} MB: refused",
            )


def _check_headers(stream: Path, archive: Path) -> None:
    """Refuse the tar stream ``stream`` unless every header in it is sound (see :class:`_HeaderScan`)."""
    with open(stream, "rb") as f:
        _HeaderScan(f, os.fstat(f.fileno()).st_size, archive).run()


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
    same rules as any folder); one unpacked from another archive of the same name is refused. Concurrent unpacks
    of one archive take turns (:func:`_locked`): the first unpacks, the others use its folder."""
    archive = Path(archive)
    target = archive_target(archive)
    _open_archive(archive).close()  # a regular file, there: refused first, whatever lies beside it
    if os.path.lexists(target):  # complete: a folder takes its name only when whole
        return _reuse(archive, target, log)
    with _locked(archive, target, log):
        if os.path.lexists(target):
            return _reuse(archive, target, log)
        _unpack_into(archive, target)
    log(f"unpacked {archive.name} into {target}/")
    return target


def _locked(archive: Path, target: Path, log: Callable[[str], Any]):
    """The advisory lock of unpacking ``archive`` (``.NAME.lock`` beside it: :func:`traces.locks.held_lock`),
    waiting while another process or thread holds it."""
    return held_lock(
        archive.parent / f".{target.name}.lock",
        f"the unpack of {archive.name}",
        lambda: log(f"waiting for another unpack of {archive.name}"),
    )


def _unpack_into(archive: Path, target: Path) -> None:
    """Unpack ``archive`` into a private temporary folder beside it, every header and member checked, and rename
    it to ``target`` when complete; nothing is left on failure."""
    work = None
    try:
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.unpack-", dir=archive.parent))
        stream, root = work / "stream.tar", work / "folder"
        sha = _copy_stream(archive, stream)
        _check_headers(stream, archive)
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
