"""Reading and writing trace files (``.npz``: a zip of ``.npy`` arrays plus ``meta.json``).

Writing is atomic (a temporary file in the same folder, then a rename) and deterministic (fixed zip
timestamps, so the same trace gives byte-identical files). Reading checks everything and raises
:class:`TraceError` with one line naming the file and the problem.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.format import Trace, TraceMeta

ARRAYS_REQUIRED = ("experts", "request_offsets", "prefill_lengths")
ARRAYS_OPTIONAL = ("weights",)
META_ENTRY = "meta.json"
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the permissions open() would
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def trace_bytes(trace: Trace) -> bytes:
    """The file content of ``trace``: deterministic for equal traces."""
    trace.validate()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        arrays = {"experts": trace.experts, "request_offsets": trace.request_offsets,
                  "prefill_lengths": trace.prefill_lengths}
        if trace.weights is not None:
            arrays["weights"] = trace.weights
        for name, arr in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arr), allow_pickle=False)
            zf.writestr(_zinfo(f"{name}.npy"), member.getvalue())
        meta = json.dumps(trace.meta.to_dict(), indent=1, sort_keys=True).encode()
        zf.writestr(_zinfo(META_ENTRY), meta)
    return buf.getvalue()


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


def _open_trace_zip(path: Path) -> zipfile.ZipFile:
    """Open a trace file's archive and check its entries; raises TraceError naming the file."""
    if not path.exists():
        raise TraceError(path, "no such file")
    if path.is_dir():
        raise TraceError(path, "is a folder, not a trace file")
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise TraceError(path, "not a trace file (not a zip/.npz archive, or truncated)") from None
    except OSError as exc:
        raise TraceError(path, f"cannot be read ({exc.strerror or exc})") from None
    names = set(zf.namelist())
    expected = {f"{a}.npy" for a in ARRAYS_REQUIRED + ARRAYS_OPTIONAL} | {META_ENTRY}
    missing = [n for n in (META_ENTRY, *(f"{a}.npy" for a in ARRAYS_REQUIRED)) if n not in names]
    if missing:
        zf.close()
        raise TraceError(path, f"not a trace file: it has no {', '.join(missing)}")
    unknown = sorted(names - expected)
    if unknown:
        zf.close()
        raise TraceError(path, f"unknown entry {unknown[0]} in trace file")
    return zf


def load_trace(path: str | os.PathLike) -> Trace:
    """Read and fully validate a trace file; raises TraceError naming the file and the problem."""
    path = Path(path)
    with _open_trace_zip(path) as zf:
        names = set(zf.namelist())
        meta = _read_meta(zf, path)
        arrays = {}
        for name in ARRAYS_REQUIRED + ARRAYS_OPTIONAL:
            if f"{name}.npy" in names:
                arrays[name] = _read_array(zf, f"{name}.npy", path)
    trace = Trace(arrays["experts"], arrays["request_offsets"], arrays["prefill_lengths"], meta,
                  arrays.get("weights"))
    try:
        trace.validate()
    except ValueError as exc:
        raise TraceError(path, str(exc)) from None
    return trace


def load_trace_header(path: str | os.PathLike) -> tuple[TraceMeta, tuple[int, ...], np.ndarray, np.ndarray]:
    """A trace's metadata, the shape of its expert array, its request offsets and prefill lengths, without reading
    the routing itself (for checking a config against a trace quickly). Raises TraceError like load_trace."""
    path = Path(path)
    with _open_trace_zip(path) as zf:
        meta = _read_meta(zf, path)
        try:
            with zf.open("experts.npy") as f:
                version = np.lib.format.read_magic(f)  # header only: no data read
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape = tuple(read_header(f)[0])
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error) as exc:
            raise TraceError(path, f"truncated or corrupt entry experts.npy ({exc})") from None
        offsets = _read_array(zf, "request_offsets.npy", path)
        prefill = _read_array(zf, "prefill_lengths.npy", path)
    return meta, shape, offsets, prefill


def _read_meta(zf: zipfile.ZipFile, path: Path) -> TraceMeta:
    try:
        raw = zf.read(META_ENTRY)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error) as exc:
        raise TraceError(path, f"truncated or corrupt {META_ENTRY} ({exc})") from None
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(path, f"{META_ENTRY} is not valid JSON ({exc})") from None
    try:
        return TraceMeta.from_dict(d)
    except ValueError as exc:
        raise TraceError(path, str(exc)) from None


def _read_array(zf: zipfile.ZipFile, member: str, path: Path) -> np.ndarray:
    try:
        with zf.open(member) as f:
            return np.lib.format.read_array(io.BytesIO(f.read()), allow_pickle=False)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise TraceError(path, f"truncated or corrupt entry {member} ({exc})") from None
    except ValueError as exc:
        raise TraceError(path, f"entry {member} is not a plain numeric array ({exc})") from None


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (a trace's checksum in results and measurements)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
