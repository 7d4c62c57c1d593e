"""Errors that mean "the user's input is wrong" (exit status 2), as opposed to bugs (exit status 1)."""


class InputError(Exception):
    """Bad input: a file, field or argument the user gave. The message is one line naming it."""


class TraceError(InputError):
    """A trace file is missing, truncated, not a trace, or breaks the format's rules."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
