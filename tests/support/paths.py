"""Where things are: the repository root and the optional ``../shared`` folder beside it."""

from __future__ import annotations

from pathlib import Path

#: The repository root (this file is tests/support/paths.py).
ROOT = Path(__file__).resolve().parents[2]

#: Real routing traces kept outside the repository; tests that read them skip when it is absent.
SHARED_TRACES = ROOT.parent / "shared" / "traces"
