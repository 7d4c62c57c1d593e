"""Advisory locks that make commands take turns on one place: a sweep's results folder, an archive's unpack.

A lock is an exclusive ``flock`` on a lock file made beside what it guards: opened without following a link and
without blocking on a FIFO, refused unless it is a regular file, and removed when released. Since the file goes
away on release, a process that waited checks, once it holds the lock, that it locked the file still in place
(else it locks the new one). The system drops a lock however its holder ends, ``kill -9`` included.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from moebase.errors import OutputError
from moebase.outputs import file_kind


@contextlib.contextmanager
def held_lock(path: Path, guards: str, when_busy: Callable[[], None]) -> Iterator[None]:
    """Hold the lock ``path`` while the block runs. When another holds it, ``when_busy()`` is called once: it raises
    to refuse, or returns (after saying so) to wait. ``guards`` names what the lock guards, for the messages."""
    fd = _take(path, guards, when_busy)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still locked: a process waiting on it sees it gone and locks a new one
        fcntl.flock(fd, fcntl.LOCK_UN)  # a forked child shares the lock: drop it for all of them
        os.close(fd)


def _take(path: Path, guards: str, when_busy: Callable[[], None]) -> int:
    """The locked descriptor of ``path``, once the file locked is the one in place."""
    told = False
    while True:
        fd = _open(path, guards)
        try:
            if not _try_lock(fd, path, guards):
                if not told:
                    when_busy()
                    told = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder before removed it: lock the new one


def _try_lock(fd: int, path: Path, guards: str) -> bool:
    """Lock ``fd`` if no one else holds it; whether it did. A file system without locks is an OutputError."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        raise OutputError(path, f"cannot be locked to guard {guards} ({exc.strerror or exc})") from None
    return True


def _open(path: Path, guards: str) -> int:
    """The lock file, opened (made if missing; never through a link, never blocking on a FIFO)."""
    flags = os.O_RDONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        raise OutputError(path, f"cannot be made to lock {guards} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OutputError(path, f"is {file_kind(path)}, not a lock file: remove it to use {guards}")
    return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)


__all__ = ["held_lock"]
