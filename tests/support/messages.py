"""What the tests of bad input check about an error's message."""

from __future__ import annotations


def checked_message(exc: BaseException, limit: int) -> str:
    """The error's message (a KeyError's own text, unquoted), checked to be one printable line (no newline, no
    control character) of at most ``limit`` characters."""
    msg = str(exc.args[0]) if isinstance(exc, KeyError) else str(exc)
    assert msg and msg.isprintable(), repr(msg[:300])
    assert len(msg) <= limit, f"{len(msg)} characters: {msg[:300]!r}"
    return msg
