"""Reading and writing trace files (``.npz``: a zip of ``.npy`` arrays plus ``meta.json``).

Writing is atomic (a temporary file in the same folder, then a rename) and deterministic (fixed zip
timestamps, so the same trace gives byte-identical files). Reading checks everything and raises
:class:`TraceError` with one line naming the file and the problem, for ANY bad file: it opens regular files only,
reads plain (stored or deflated, unencrypted) entries with the expected names, each once, and checks each size
and npy header before it allocates or inflates anything (see the limits below).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import json
import math
import os
import re
import stat
import struct
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from moebase.errors import TraceError, brief, one_line
from moebase.outputs import atomic_write_bytes as atomic_write_bytes  # re-exported: writing lives in moebase.outputs
from moebase.outputs import check_output_file as check_output_file
from moebase.outputs import check_output_folder as check_output_folder
from moebase.outputs import file_kind as file_kind
from moebase.outputs import kind_name, note_input
from traces.format import MAX_REQUESTS, Trace, TraceMeta

ARRAYS_REQUIRED = ("experts", "request_offsets", "prefill_lengths")
ARRAYS_OPTIONAL = ("weights",)
META_ENTRY = "meta.json"
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def trace_bytes(trace: Trace) -> bytes:
    """The file content of ``trace``: deterministic for equal traces."""
    trace.validate()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        arrays = {
            "experts": trace.experts,
            "request_offsets": trace.request_offsets,
            "prefill_lengths": trace.prefill_lengths,
        }
        if trace.weights is not None:
            arrays["weights"] = trace.weights
        for name, arr in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arr), allow_pickle=False)
            zf.writestr(_zinfo(f"{name}.npy"), member.getvalue())
        meta = json.dumps(trace.meta.to_dict(), indent=1, sort_keys=True).encode()
        problem = metadata_problem(trace.meta, meta)
        if problem:  # never write a file the reader refuses
            raise ValueError(problem)
        zf.writestr(_zinfo(META_ENTRY), meta)
    return buf.getvalue()


def metadata_problem(meta: TraceMeta, encoded: bytes | None = None) -> str | None:
    """Why the reader would refuse ``meta`` as written (an empty name, a string that is not valid Unicode, too
    large or deep), or None: the reader's own checks, run on what would be written."""
    if encoded is None:
        encoded = json.dumps(meta.to_dict(), indent=1, sort_keys=True).encode()
    if len(encoded) > MAX_META_BYTES:
        return f"metadata is {len(encoded)} bytes as JSON, over the limit of {MAX_META_BYTES}"
    text = encoded.decode()
    d = json.loads(text)
    problem = _json_problem(d, text)
    if problem:
        return f"metadata {problem}"
    try:
        TraceMeta.from_dict(d)
    except ValueError as exc:
        return str(exc)
    return None


def _zinfo(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def save_trace(trace: Trace, path: str | os.PathLike) -> Path:
    """Validate ``trace`` and write it atomically to ``path``; returns the path."""
    try:
        data = trace_bytes(trace)
    except ValueError as exc:
        raise TraceError(path, f"refusing to write an invalid trace: {exc}") from None
    atomic_write_bytes(path, data)
    return Path(path)


# ------------------------------------------------------------------------------------------------ reading
# Everything in a trace file is untrusted: each limit below bounds the time and memory a bad file can cost, and
# every way the zip, npy or JSON decoders fail on bad bytes becomes a TraceError naming the file.

#: The largest uncompressed array entry (4 GiB: ~2 billion int16 expert ids) and meta.json (256 MiB) read.
MAX_ARRAY_BYTES = 4 << 30
MAX_META_BYTES = 256 << 20
#: The deepest nesting of objects and lists meta.json may have (the format itself needs 4; notes add a few).
MAX_META_DEPTH = 64
#: Compression methods a trace may use, each with the most bytes one compressed byte can expand to (deflate's
#: longest match, 258 bytes, costs at least 2 bits: 1032). A larger claim is a corrupt or hostile entry.
_MAX_EXPANSION = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: 1032}
#: zip flag bits that mean encrypted (bit 0), patched (bit 5) or strongly encrypted (bit 6) data.
_UNREADABLE_FLAGS = 0x1 | 0x20 | 0x40
#: What zipfile and zlib raise on a corrupt, truncated or unsupported archive or entry.
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    OSError,
    ValueError,
    OverflowError,
    NotImplementedError,
    RuntimeError,
    struct.error,
)
_READ_CHUNK = 16 << 20
_SURROGATE_ESCAPE = re.compile(r"\\u[dD]")


def _why(exc: BaseException) -> str:
    """An exception as a short clause for an error message."""
    text = str(exc)
    return f"{type(exc).__name__}: {one_line(text, 120)}" if text else type(exc).__name__


def open_regular_file(path: str | os.PathLike, what: str = "trace file") -> IO[bytes]:
    """``path`` opened for binary reading, if it is a regular file: a FIFO would block forever and /dev/zero never
    ends, so anything else is refused with a TraceError saying what it is (checked before opening, without
    blocking, and again on the opened file). ``what`` names the file expected, for the message."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise TraceError(path, f"is a folder, not a {what}")
        if stat.S_ISREG(mode):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
            if stat.S_ISREG(os.fstat(fd).st_mode):
                note_input(fd, path)
                return os.fdopen(fd, "rb")
            os.close(fd)  # replaced by something else since the stat
            mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise TraceError(path, "no such file") from None
    except OSError as exc:
        raise TraceError(path, f"cannot be read ({exc.strerror or _why(exc)})") from None
    except ValueError as exc:  # e.g. a NUL byte in the path
        raise TraceError(path, f"is not a usable file path ({_why(exc)})") from None
    kind = kind_name(mode)
    raise TraceError(path, f"is {kind}, not a regular file; give a {what}")


_open_regular_file = open_regular_file


@contextlib.contextmanager
def open_zip(
    path: str | os.PathLike, what: str = "trace file", max_entries: int | None = None, not_zip: str | None = None
) -> Iterator[zipfile.ZipFile]:
    """The zip archive in the regular file ``path``, its entry names checked (each once, at most ``max_entries``);
    a TraceError naming the file otherwise (``what`` names the archive expected, e.g. "trace file"; ``not_zip``
    begins the message for a file that is not a zip archive, "not a trace file" by default)."""
    path = Path(path)
    not_zip = not_zip or f"not a {what}"
    with open_regular_file(path, what) as f:
        try:
            zf = zipfile.ZipFile(f)
        except zipfile.BadZipFile:
            raise TraceError(path, f"{not_zip} (not a zip/.npz archive, or truncated)") from None
        except _ZIP_ERRORS as exc:
            raise TraceError(path, f"{not_zip} (unreadable zip archive: {_why(exc)})") from None
        with zf:
            names = zf.namelist()
            if max_entries is not None and len(names) > max_entries:
                raise TraceError(path, f"holds {len(names)} entries, more than the {max_entries} a {what} may have")
            twice = sorted(n for n, count in collections.Counter(names).items() if count > 1)
            if twice:  # zipfile would read the last copy, another reader the first: ambiguous
                raise TraceError(path, f"entry {brief(twice[0])} appears more than once in the {what}")
            yield zf


@contextlib.contextmanager
def _open_trace_zip(path: Path) -> Iterator[zipfile.ZipFile]:
    """The archive of a trace file, its entries checked (the expected names, each once); TraceError naming the
    file otherwise."""
    with open_zip(path) as zf:
        names = zf.namelist()
        expected = {f"{a}.npy" for a in ARRAYS_REQUIRED + ARRAYS_OPTIONAL} | {META_ENTRY}
        missing = [n for n in (META_ENTRY, *(f"{a}.npy" for a in ARRAYS_REQUIRED)) if n not in names]
        if missing:
            raise TraceError(path, f"not a trace file: it has no {', '.join(missing)}")
        unknown = sorted(set(names) - expected)
        if unknown:
            raise TraceError(path, f"unknown entry {brief(unknown[0])} in trace file")
        yield zf


def load_trace(path: str | os.PathLike) -> Trace:
    """Read and fully validate a trace file; raises TraceError naming the file and the problem."""
    path = Path(path)
    with _open_trace_zip(path) as zf:
        names = set(zf.namelist())
        meta = _read_meta(zf, path)
        arrays = {}
        for name in ARRAYS_REQUIRED + ARRAYS_OPTIONAL:
            if f"{name}.npy" in names:
                arrays[name] = _read_array(zf, f"{name}.npy", path, max_items=_MAX_ITEMS.get(name))
    trace = Trace(arrays["experts"], arrays["request_offsets"], arrays["prefill_lengths"], meta, arrays.get("weights"))
    try:
        trace.validate()
    except ValueError as exc:
        raise TraceError(path, str(exc)) from None
    return trace


#: The most values the per-request arrays may hold (a trace of more requests is refused before they are read).
_MAX_ITEMS = {"request_offsets": MAX_REQUESTS + 1, "prefill_lengths": MAX_REQUESTS}


def load_trace_header(path: str | os.PathLike) -> tuple[TraceMeta, tuple[int, ...], np.ndarray, np.ndarray]:
    """A trace's metadata, the shape of its expert array, its request offsets and prefill lengths, without reading
    the routing itself (for checking a config against a trace quickly). Raises TraceError like load_trace."""
    path = Path(path)
    with _open_trace_zip(path) as zf:
        meta = _read_meta(zf, path)
        with _entry(zf, "experts.npy", path, MAX_ARRAY_BYTES) as (f, info):
            shape, _, _ = _npy_header(f, f"entry {info.filename}", info.file_size, path)  # header only
        offsets = _read_array(zf, "request_offsets.npy", path, max_items=_MAX_ITEMS["request_offsets"])
        prefill = _read_array(zf, "prefill_lengths.npy", path, max_items=_MAX_ITEMS["prefill_lengths"])
    return meta, shape, offsets, prefill


@contextlib.contextmanager
def _entry(zf: zipfile.ZipFile, name: str, path: Path, limit: int) -> Iterator[tuple[IO[bytes], zipfile.ZipInfo]]:
    """An entry opened for reading, after checking that it can be read within ``limit`` uncompressed bytes; what
    zipfile raises while it is read becomes TraceError ("truncated or corrupt entry")."""
    info = zf.getinfo(name)
    if info.flag_bits & _UNREADABLE_FLAGS:
        raise TraceError(
            path,
            f"entry {name} is encrypted or patched (zip flags {info.flag_bits:#x}); only plain zip entries are read",
        )
    expansion = _MAX_EXPANSION.get(info.compress_type)
    if expansion is None:
        raise TraceError(
            path,
            f"entry {name} uses zip compression method {info.compress_type}; only stored (0) and deflate (8) are read",
        )
    if info.file_size > limit:
        raise TraceError(path, f"entry {name} is {info.file_size} bytes uncompressed, over the limit of {limit}")
    if info.file_size > info.compress_size * expansion + 4096:
        raise TraceError(
            path,
            f"entry {name} claims {info.file_size} bytes from {info.compress_size} "
            f"compressed bytes, more than its compression can give (corrupt)",
        )
    try:
        with zf.open(info) as f:
            yield f, info
    except _ZIP_ERRORS as exc:
        raise TraceError(path, f"truncated or corrupt entry {name} ({_why(exc)})") from None


def _read_meta(zf: zipfile.ZipFile, path: Path) -> TraceMeta:
    with _entry(zf, META_ENTRY, path, MAX_META_BYTES) as (f, info):
        raw = f.read(info.file_size)  # a bounded read: zipfile then never inflates more than that
        if len(raw) < info.file_size:
            raise TraceError(path, f"truncated or corrupt entry {META_ENTRY} (not {info.file_size} bytes long)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(path, f"{META_ENTRY} is not UTF-8 text (byte {exc.start})") from None
    try:
        d = json.loads(text)
    except RecursionError:
        raise TraceError(
            path, f"{META_ENTRY} nests objects or lists too deeply (the limit is {MAX_META_DEPTH})"
        ) from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise TraceError(path, f"{META_ENTRY} is not valid JSON ({_why(exc)})") from None
    problem = _json_problem(d, text)
    if problem:
        raise TraceError(path, f"{META_ENTRY} {problem}")
    try:
        return TraceMeta.from_dict(d)
    except ValueError as exc:
        raise TraceError(path, str(exc)) from None


def _json_problem(value: Any, text: str) -> str | None:
    """What makes meta.json's parsed ``value`` unusable as metadata, or None: nesting deeper than MAX_META_DEPTH,
    or a string that is not valid Unicode (a lone surrogate such as "\\ud800", which cannot be printed or written
    as UTF-8; only a \\uD... escape in ``text`` makes one)."""
    kinds = (dict, list, str) if _SURROGATE_ESCAPE.search(text) else (dict, list)
    nested = frozenset(kinds).__contains__
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if type(v) is str:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return f"holds a string that is not valid Unicode: {brief(v)}"
        elif type(v) in (dict, list):
            if depth > MAX_META_DEPTH:
                return f"nests objects or lists too deeply (the limit is {MAX_META_DEPTH})"
            items = [*v.keys(), *v.values()] if type(v) is dict else v
            if any(map(nested, map(type, items))):  # at C speed: most lists hold numbers only
                stack.extend((x, depth + 1) for x in items if nested(type(x)))
    return None


def _npy_header(f: IO[bytes], label: str, size: int, path: Path) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) from the header of the npy data ``f`` (``size`` bytes in all; left at the
    start of the data), after checking that it holds a plain numeric array of at most 3 dimensions and enough
    bytes for its shape: nothing is allocated for a header that claims more data than there is. ``label`` names
    the array in messages ("entry experts.npy")."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy warns (on stderr) when it re-parses a Python 2 header
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:  # 3.0 only differs for structured dtypes with non-Latin-1 field names, never a trace's
                raise ValueError(f"npy format version {version} is not used by trace files")
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError):
        raise  # the entry's bytes, not its header: _entry reports them
    except Exception as exc:  # garbage headers make numpy's parser raise nearly anything (SyntaxError,
        # tokenize.TokenError, TypeError, RecursionError, ...): all of it means "not an npy array"
        raise TraceError(path, f"{label} is not a plain numeric array (bad npy header: {_why(exc)})") from None
    if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
        raise TraceError(
            path,
            f"{label} is not a plain numeric array (dtype {brief(dtype.str)}; integer, float or bool arrays are read)",
        )
    if len(shape) > 3 or any(n < 0 for n in shape):
        raise TraceError(path, f"{label} has shape {brief(list(shape))}; trace arrays have 1 to 3 dimensions")
    need = math.prod(shape) * dtype.itemsize
    have = size - f.tell()
    if need > have:
        raise TraceError(
            path,
            f"{label} has {have} bytes of data but its header claims {dtype} "
            f"{brief(list(shape))} ({need} bytes): truncated or corrupt",
        )
    return tuple(shape), fortran, dtype


def _read_npy(f: IO[bytes], label: str, size: int, path: Path, max_items: int | None = None) -> np.ndarray:
    """The plain numeric array in the npy data ``f`` of ``size`` bytes, read into memory allocated once for the
    size its header gives (at most ``max_items`` values), then read to its end (so that zipfile checks a CRC)."""
    shape, fortran, dtype = _npy_header(f, label, size, path)
    count = math.prod(shape)
    if max_items is not None and count > max_items:
        raise TraceError(path, f"{label} holds {count} values, more than the limit of {max_items}")
    try:
        flat = np.empty(count, dtype=dtype)
    except MemoryError:
        raise TraceError(path, f"{label} needs {count * dtype.itemsize} bytes, more memory than there is") from None
    buf, done = flat.data.cast("B"), 0
    reader = cast(io.BufferedIOBase, f)  # a zip entry or a file opened "rb": buffered, though typed IO[bytes]
    while done < len(buf):
        n = reader.readinto(buf[done : done + _READ_CHUNK])
        if not n:
            raise TraceError(path, f"truncated or corrupt {label} (data ends early)")
        done += n
    while f.read(_READ_CHUNK):  # the rest (npy allows padding), so that zipfile checks the entry's CRC
        pass
    return flat.reshape(shape, order="F" if fortran else "C")


def _read_array(
    zf: zipfile.ZipFile, member: str, path: Path, limit: int | None = None, max_items: int | None = None
) -> np.ndarray:
    """A plain numeric array entry of at most ``limit`` bytes (default MAX_ARRAY_BYTES) and ``max_items`` values,
    read within bounds."""
    with _entry(zf, member, path, MAX_ARRAY_BYTES if limit is None else limit) as (f, info):
        return _read_npy(f, f"entry {member}", info.file_size, path, max_items)


def read_npy_entry(zf: zipfile.ZipFile, member: str, path: str | os.PathLike, limit: int | None = None) -> np.ndarray:
    """The array entry ``member`` of an archive opened with :func:`open_zip` (an ``.npz``), read under the same
    rules as a trace's arrays: a plain (stored or deflated, unencrypted) entry of at most ``limit`` bytes holding
    a plain numeric array of at most 3 dimensions, its header checked against its size before anything is
    allocated or inflated. Anything else raises TraceError naming the file and the entry."""
    return _read_array(zf, member, Path(path), limit)


def read_npy_file(path: str | os.PathLike, limit: int | None = None, what: str = "numpy .npy file") -> np.ndarray:
    """The array in the regular file ``path`` (an ``.npy``), read under the rules of :func:`read_npy_entry`."""
    path = Path(path)
    limit = MAX_ARRAY_BYTES if limit is None else limit
    with open_regular_file(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise TraceError(path, f"is {size} bytes, over the limit of {limit} for a {what}")
        try:
            return _read_npy(f, "the array", size, path)
        except (EOFError, OSError) as exc:
            raise TraceError(path, f"truncated or corrupt {what} ({_why(exc)})") from None


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (a trace's checksum in results and measurements)."""
    h = hashlib.sha256()
    with open_regular_file(path) as f:  # a FIFO or /dev/zero put in a trace's place must not hang the caller
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
