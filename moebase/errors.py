"""Errors that mean "the user's input is wrong" (exit status 2), as opposed to bugs (exit status 1): a trace
(TraceError), an output that cannot be written (OutputError), a config field, profile or file (ConfigError).

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
#: ConfigError: the longest field name and problem a message holds (a user's value can be anything).
CONFIG_FIELD_CHARS = 200
CONFIG_PROBLEM_CHARS = 500

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40


def one_line(text: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as one printable line of at most ``limit`` characters, for an error message or a comment.

    Every run of whitespace (line breaks of any kind, tabs, form feeds, Unicode spaces) becomes one space and the
    ends are trimmed, so the line cannot be split or padded; every other character that is not printable (an
    escape code, a NUL, a lone surrogate) is shown escaped (``\\x1b``), so a terminal never interprets it. A longer
    result is cut and ends in "...". Only the first 4 x ``limit`` characters of ``text`` are read (a megabyte of
    input costs no more than a short one); when that drops some, the result ends in "..." too. This is the one
    implementation: ``moebase.errors.ConfigError`` and every caller in sim, traces and validate use it."""
    limit = max(limit, 0)
    raw = str(text)
    line = " ".join(raw[: 4 * limit].split())
    if not line.isprintable():
        line = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in line)
    if len(line) > limit or len(raw) > 4 * limit:
        line = line[: max(limit - 3, 0)] + "..."
    return line[:limit]


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


class OutputError(InputError):
    """An output could not be written (a full disk, a read-only mount, a file-size or quota limit): ``PATH: cannot be
    written (reason)``, one line, exit status 2 like bad input, since what fixes it is outside the program (free
    space, another ``--out``) and a rerun then just works."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = one_line(problem, MAX_PROBLEM_CHARS)
        super().__init__(f"{one_line(self.path, MAX_PATH_CHARS)}: {self.problem}")


class ConfigError(InputError):
    """A config value is wrong. The message is one line, ``FIELD: problem``, where FIELD is the dotted path of the
    field (``workload.batch_size``) or a file path; both are cut to a bounded length.

    ``ConfigError("workload.batch_size", "must be an integer >= 1, got 0")`` and
    ``ConfigError("workload.batch_size: must be an integer >= 1, got 0")`` are the same error.
    """

    def __init__(self, field: str, problem: str | None = None):
        if problem is None:
            field, sep, problem = str(field).partition(": ")
            if not sep:
                field, problem = "", field
        self.field = one_line(field, CONFIG_FIELD_CHARS)
        self.problem = one_line(problem, CONFIG_PROBLEM_CHARS)
        super().__init__(f"{self.field}: {self.problem}" if self.field else self.problem)
