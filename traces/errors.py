"""Errors that mean "the user's input is wrong" (exit status 2), as opposed to bugs (exit status 1).

The command lines print such an error as ONE line, so an error never spans lines or grows with the input:
:func:`one_line` and :func:`brief` bound what a message echoes back.
"""

from __future__ import annotations

import reprlib

#: The longest message an InputError prints (a bad input must not turn into a megabyte of error text).
MAX_MESSAGE_CHARS = 2000
#: TraceError: the longest file path and problem text it prints (so ``PATH: problem`` stays under ~500 chars).
MAX_PATH_CHARS = 200
MAX_PROBLEM_CHARS = 300

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40


def one_line(text: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as one printable line (every kind of line break becomes a space, other control characters are
    escaped), cut to ``limit`` characters with "..."."""
    text = " ".join(str(text)[:4 * limit].splitlines())
    if not text.isprintable():
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:max(limit - 3, 0)] + "..."


def brief(value: object, limit: int = 80) -> str:
    """A short repr of ``value`` (at most ``limit`` characters) for echoing a bad value in an error message:
    a 5-million-character string or a deeply nested list shows as its first few characters and "..."."""
    try:
        text = _REPR.repr(value)
    except Exception:  # a repr that fails (e.g. an int too long to print) must not hide the real error
        text = f"<{type(value).__name__}>"
    return one_line(text, limit)


class InputError(Exception):
    """Bad input: a file, field or argument the user gave. The message is one line naming it, of bounded length
    (line breaks collapse to spaces, and more than MAX_MESSAGE_CHARS characters are cut)."""

    def __str__(self) -> str:
        return one_line(super().__str__())


class TraceError(InputError):
    """A trace file is missing, truncated, not a trace, or breaks the format's rules: ``PATH: problem``, one line,
    with the path cut to MAX_PATH_CHARS and the problem to MAX_PROBLEM_CHARS characters."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = one_line(problem, MAX_PROBLEM_CHARS)
        super().__init__(f"{one_line(self.path, MAX_PATH_CHARS)}: {self.problem}")
