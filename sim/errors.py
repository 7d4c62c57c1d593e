"""The simulator's "bad user input" error: a config field, profile or file the user gave is wrong (exit status 2)."""

from __future__ import annotations

from traces.errors import InputError, one_line

#: The longest field name and problem a message holds; longer ones are cut (a user's value can be anything).
MAX_FIELD_CHARS = 200
MAX_PROBLEM_CHARS = 500


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
        self.field = one_line(field, MAX_FIELD_CHARS)
        self.problem = one_line(problem, MAX_PROBLEM_CHARS)
        super().__init__(f"{self.field}: {self.problem}" if self.field else self.problem)
