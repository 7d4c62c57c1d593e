"""`python -m traces {import,record,synth,stats,validate}`: the command line of the traces package.

Each sub-command lives in its own module that exposes ``register(subparsers)``; heavy imports (torch,
transformers) happen inside the command, so `stats` and `validate` start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from moebase.errors import InputError, one_line

COMMAND_MODULES = (
    "traces.importers.cli",
    "traces.record.cli",
    "traces.synthetic.cli",
    "traces.analysis.stats",
    "traces.check",
)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad argument reported as the one line ``error: PROG: problem`` (exit status 2) instead of
    the usage block followed by the error: the contract of every command line here. ``--help`` still prints usage.
    Sub-command parsers are of the same class (argparse makes them with ``type(self)``)."""

    def error(self, message: str):  # noqa: D401 (argparse's hook)
        self.exit(2, f"error: {one_line(self.prog, 80)}: {one_line(message, 300)}\n")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = OneLineParser(prog="python -m traces", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


#: Control characters a terminal may act on (C0 but tab, line feed and carriage return; DEL; C1, CSI included),
#: each shown escaped (``\x1b``) in anything a command prints: data (a row id, a request name) cannot move the
#: cursor, recolour or retitle the terminal, or hide text.
_TERMINAL_ESCAPES = {c: ascii(chr(c))[1:-1] for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if chr(c) not in "\t\n\r"}


class EscapingWriter:
    """A text stream that writes through to ``stream`` with the control characters of ``_TERMINAL_ESCAPES``
    escaped."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(text.translate(_TERMINAL_ESCAPES))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def escaped_terminal():
    """Within the block, everything printed to stdout and stderr has its control characters escaped."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingWriter(sys.stdout), EscapingWriter(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def run_main(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse, run ``args.func(args)`` inside one output batch (its files appear together when it returns, none of
    them when it fails: :func:`moebase.outputs.output_batch`), and turn bad input, or a write the system refused (a
    full disk, a read-only mount, a size or quota limit), into one line on stderr and exit status 2. What the
    command prints has its control characters escaped (:func:`escaped_terminal`)."""
    args = parser.parse_args(argv)
    with escaped_terminal():
        return _run(args)


def _run(args) -> int:
    """``args.func(args)`` in one output batch, its errors as one line and an exit status."""
    from moebase.outputs import WRITE_FAULTS, output_batch

    try:
        with output_batch():
            try:
                return int(args.func(args) or 0)
            except BrokenPipeError:  # output piped into `head` and the like: the files staged so far are kept
                sys.stderr.close()
                return 0
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in WRITE_FAULTS:
            raise
        where = one_line(exc.filename, 200) if exc.filename is not None else "an output"
        print(f"error: {where}: cannot be written ({one_line(exc.strerror or exc, 200)})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None, make_run_config=None) -> int:
    """The command line. ``make_run_config`` (a :data:`traces.run_setup.RunConfigMaker`) makes the run config that
    ``import`` and ``record`` write beside a trace; without it (the trace tools alone) they write the trace and fail
    in one line saying that no run config was made (``--no-run-config`` asks for the trace alone)."""
    parser = build_parser()
    parser.set_defaults(make_run_config=make_run_config)
    return run_main(parser, argv)
