"""Where a command may write, and how its outputs appear: together or not at all.

An output place is checked before any work (:func:`check_output_file`, :func:`check_output_folder`): a FIFO, a
device, a socket or the wrong kind of entry is refused, as is a place that is one of the command's own inputs
(:func:`check_not_input`). Every file is written to a temporary sibling and renamed (:func:`atomic_write_bytes`).

Inside an :func:`output_batch` (every command line runs in one: ``traces.cli.run_main``) the renames wait until the
command has finished: its files appear together when it succeeds, and none of them when anything fails on the way
(bad input found late, a full disk, a read-only mount, a file-size or quota limit), so a rerun after the cause is
fixed just works. A write that fails is an :class:`~moebase.errors.OutputError` naming the file (exit status 2).
Progress that a later run resumes from (a sweep's rows, a measurement's runs) is written ``at_once``.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from moebase.errors import OutputError, TraceError, brief

#: The errors of a write that a user fixes outside the program (space, a mount, a size or quota limit): exit 2.
WRITE_FAULTS = frozenset(e for e in (errno.ENOSPC, errno.EROFS, errno.EFBIG, getattr(errno, "EDQUOT", None)) if e)


def check_output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """``path`` as a place to write a file: missing, or an existing regular file (replaced whole). A folder, a
    FIFO, a device, a socket or a name the system refuses (too long, NUL byte) is refused with a TraceError: a
    rename over a special file would replace it (as root, ``/dev/full`` itself), and nothing is written."""
    p = Path(path)
    if str(path) == "":
        raise TraceError("''", f"empty {what} name")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        raise TraceError(path, f"cannot be written ({getattr(exc, 'strerror', None) or exc})") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            target = file_kind(p)
            if target not in ("missing", "file"):
                raise TraceError(path, f"is a link to {target}: cannot write the {what} there")
        elif stat.S_ISDIR(st.st_mode):
            raise TraceError(path, f"is a folder: cannot write the {what} there")
        elif not stat.S_ISREG(st.st_mode):
            raise TraceError(
                path,
                f"is {_KIND_NAMES.get(stat.S_IFMT(st.st_mode), 'a special file')}: refusing to "
                f"replace it with the {what}",
            )
    parent = p.parent
    kind = file_kind(parent)
    if kind not in ("missing", "folder"):
        raise TraceError(path, f"cannot be written: {parent} is {_article(kind)}, not a folder")
    return p


def check_output_folder(path: str | os.PathLike, what: str = "output folder") -> Path:
    """``path`` as a folder to write results in: missing (it will be made) or an existing folder; a regular file,
    a FIFO, a device or a socket in its place is refused with a TraceError before anything is written."""
    p = Path(path)
    if str(path) == "":
        raise TraceError("''", f"empty {what} name")
    kind = file_kind(p)
    if kind not in ("missing", "folder"):
        raise TraceError(path, f"is {_article(kind)}, not a folder: cannot write the {what} there")
    for parent in p.parents:
        k = file_kind(parent)
        if k == "folder":
            break
        if k != "missing":
            raise TraceError(path, f"cannot be made: {parent} is {_article(k)}, not a folder")
    return p


_KIND_NAMES = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
    stat.S_IFREG: "a regular file",
    stat.S_IFLNK: "a symbolic link",
}


def kind_name(mode: int) -> str:
    """A file mode's kind as a phrase after "is": "a FIFO (named pipe)", "a character device"."""
    return _KIND_NAMES.get(stat.S_IFMT(mode), "a special file")


def _article(kind: str) -> str:
    """A :func:`file_kind` answer as a phrase after "is": "a regular file", "a FIFO (named pipe)"."""
    return {"file": "a regular file", "folder": "a folder"}.get(kind, kind)


def file_kind(path: str | os.PathLike) -> str:
    """What ``path`` names, following links: "missing", "file", "folder", or a phrase for anything else
    ("a FIFO (named pipe)", "a character device", "an unreadable path (...)")."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # a path through a file names nothing
        return "missing"
    except (OSError, ValueError) as exc:
        return f"an unreadable path ({getattr(exc, 'strerror', None) or exc})"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "folder"
    return _KIND_NAMES.get(stat.S_IFMT(st.st_mode), "a special file")


# ------------------------------------------------------------------------------------------------ inputs
def check_not_input(
    path: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (), flag: str = "--out"
) -> None:
    """Refuse an output ``path`` that is one of ``inputs`` or a file the running command has read so far (the same
    file by any name: a link, a hard link, ``./x``): writing it would replace what is read. Called before the work,
    once the inputs are read; :func:`atomic_write_bytes` checks again when it writes. OutputError naming ``flag``."""
    for given in inputs:
        if given is None or not os.path.lexists(given) or not os.path.lexists(path):
            continue
        try:
            same = os.path.samefile(path, given)
        except (OSError, ValueError):
            same = False
        if same:
            raise OutputError(
                f"{flag} {brief(str(path), 200)}",
                f"is the input file {brief(str(given), 200)}; writing it would replace what is read (write elsewhere)",
            )
    batch = _BATCH.get()
    if batch is not None:
        _refuse_input(Path(path), batch)


# ------------------------------------------------------------------------------------------------ writing
class OutputBatch:
    """The files of one command, staged as temporary siblings and renamed into place together (:meth:`commit`), or
    all removed with any folder the batch made (:meth:`discard`)."""

    def __init__(self) -> None:
        self.staged: dict[Path, Path] = {}  # final path -> its temporary sibling
        self.made: list[Path] = []  # folders made for the outputs, outermost first
        self.inputs: dict[tuple[int, int], str] = {}  # (device, inode) of each file read -> the name it was read by

    def names(self) -> str:
        return ", ".join(p.name for p in self.staged) or "none"

    def commit(self) -> list[Path]:
        """Rename every staged file into place (each checked again: nothing special put there meanwhile)."""
        done: list[Path] = []
        for path, tmp in list(self.staged.items()):
            try:
                check_output_file(path)
                os.replace(tmp, path)
            except OSError as exc:
                self.discard()
                raise _fault(path, exc, f"{len(done)} of {len(self.staged) + len(done)} files were renamed") from None
            del self.staged[path]
            done.append(path)
        self.made.clear()
        return done

    def discard(self) -> None:
        """Remove every staged file and the folders the batch made (when they are empty)."""
        for tmp in self.staged.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self.staged.clear()
        for folder in reversed(self.made):
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        self.made.clear()


_BATCH: contextvars.ContextVar[OutputBatch | None] = contextvars.ContextVar("output_batch", default=None)


@contextlib.contextmanager
def output_batch() -> Iterator[OutputBatch]:
    """Stage every :func:`atomic_write_bytes` inside the block, and rename the files into place when it ends without
    an exception (else remove them all). A batch inside a batch joins the outer one."""
    outer = _BATCH.get()
    if outer is not None:
        yield outer
        return
    batch = OutputBatch()
    token = _BATCH.set(batch)
    try:
        yield batch
    except BaseException:
        batch.discard()
        raise
    finally:
        _BATCH.reset(token)
    batch.commit()


@contextlib.contextmanager
def immediate_outputs() -> Iterator[None]:
    """Inside the block, each file appears as soon as it is written, batch or not: for progress that a later run
    resumes from (a measurement's runs and calibration passes), which a failure later must not take away."""
    token = _BATCH.set(None)
    try:
        yield
    finally:
        _BATCH.reset(token)


def note_input(fd: int, path: str | os.PathLike) -> None:
    """Record the file open on ``fd`` (read as ``path``) as an input of the running command: no output of its batch
    may replace it (:func:`atomic_write_bytes` refuses, by device and inode, so any other name of it too)."""
    batch = _BATCH.get()
    if batch is not None:
        st = os.fstat(fd)
        batch.inputs.setdefault((st.st_dev, st.st_ino), str(path))


def _refuse_input(path: Path, batch: OutputBatch) -> None:
    """OutputError when ``path`` is a file this command has read."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    read_as = batch.inputs.get((st.st_dev, st.st_ino))
    if read_as is not None:
        shown = "" if os.path.abspath(read_as) == os.path.abspath(path) else f" (read as {brief(read_as, 200)})"
        raise OutputError(
            path, f"is an input of this command{shown}: writing it would replace what was read; write elsewhere"
        )


def keep_staged() -> list[Path]:
    """Rename the files staged so far into place: what a command keeps when a later, optional step of it fails
    (an import's trace, when the run config beside it cannot be made)."""
    batch = _BATCH.get()
    return batch.commit() if batch is not None else []


def staged_path(path: str | os.PathLike) -> Path:
    """Where the content written to ``path`` can be read now: its temporary sibling while a batch holds it."""
    batch = _BATCH.get()
    p = Path(path)
    return batch.staged.get(p, p) if batch is not None else p


def ensure_folder(path: str | os.PathLike) -> Path:
    """``path`` as a folder, made (with its missing parents) if needed; inside a batch, the folders made are removed
    again if the batch is discarded. OutputError naming the folder when it cannot be made."""
    p = Path(path)
    missing = [q for q in [p, *p.parents] if not os.path.lexists(q)]
    batch = _BATCH.get()
    for q in reversed(missing):
        try:
            os.mkdir(q)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _fault(q, exc, "nothing was written") from None
        if batch is not None:
            batch.made.append(q)
    return p


def atomic_write_bytes(path: str | os.PathLike, data: bytes, at_once: bool = False) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one. Only a missing
    path or a regular file is ever replaced (:func:`check_output_file`): never a FIFO, a device or a folder. Inside
    an :func:`output_batch` the file appears when the batch commits, unless ``at_once``. A failed write removes
    what it wrote and raises OutputError naming ``path``."""
    path = check_output_file(path)
    batch = None if at_once else _BATCH.get()
    if batch is not None:
        _refuse_input(path, batch)
    ensure_folder(path.parent)
    tmp = _write_temp(path, data, batch)
    if batch is not None:
        old = batch.staged.pop(path, None)
        if old is not None:
            with contextlib.suppress(OSError):
                os.unlink(old)
        batch.staged[path] = tmp
        return
    try:
        check_output_file(path)  # nothing special was put in its place meanwhile
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _fault(path, exc, "it is left as it was") from None
        raise


def _write_temp(path: Path, data: bytes, batch: OutputBatch | None) -> Path:
    """``data`` in a new temporary sibling of ``path`` (flushed to disk), with the permissions open() would give."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _fault(path, exc, _nothing(batch)) from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            _write_all(f, data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _fault(path, exc, _nothing(batch)) from None
        raise
    return Path(tmp)


def _write_all(f, data: bytes) -> None:
    """The one place file content is written (a test injects write faults here)."""
    f.write(data)


def _nothing(batch: OutputBatch | None) -> str:
    if batch is None or not batch.staged:
        return "nothing was written"
    return f"none of this command's files were written (also staged: {brief(batch.names(), 200)})"


def _fault(path: str | os.PathLike, exc: OSError, after: str) -> OutputError:
    """A failed write as one line: the file, the system's reason, and what was left."""
    why = exc.strerror or str(exc) or type(exc).__name__
    hint = " (free some space, or write elsewhere)" if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)) else ""
    return OutputError(path, f"cannot be written ({why}){hint}; {after}")


__all__ = [
    "WRITE_FAULTS",
    "OutputBatch",
    "atomic_write_bytes",
    "check_not_input",
    "check_output_file",
    "check_output_folder",
    "ensure_folder",
    "file_kind",
    "immediate_outputs",
    "keep_staged",
    "note_input",
    "kind_name",
    "output_batch",
    "staged_path",
]
