"""The simulator's "bad user input" error: a config field, profile or file the user gave is wrong (exit status 2)."""

from __future__ import annotations

from traces.errors import InputError


class ConfigError(InputError):
    """A config value is wrong. The message is one line, ``FIELD: problem``, where FIELD is the dotted path of the
    field (``workload.batch_size``) or a file path.

    ``ConfigError("workload.batch_size", "must be an integer >= 1, got 0")`` and
    ``ConfigError("workload.batch_size: must be an integer >= 1, got 0")`` are the same error.
    """

    def __init__(self, field: str, problem: str | None = None):
        if problem is None:
            field, sep, problem = str(field).partition(": ")
            if not sep:
                field, problem = "", field
        self.field = str(field)
        self.problem = " ".join(str(problem).split())  # one line
        super().__init__(f"{self.field}: {self.problem}" if self.field else self.problem)
