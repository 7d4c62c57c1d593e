"""Fixtures shared by every test folder: the real Mixtral routing from ../shared (skipped when absent) and the
validator's tiny model with a skewed trace. Plain helpers live in ``tests/support/``, restated reference rules in
``tests/reference/``."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tests.support.paths import SHARED_TRACES
from tests.support.validate import tiny_files

# CI explores the same examples on every run (a new random counterexample is found by developers, not by CI)
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


SHARED_MIXTRAL = SHARED_TRACES / "mixtral-8x7b-instruct"
MIXTRAL_FILES = {name: SHARED_MIXTRAL / f"{name}_2_routing.jsonl" for name in ("humaneval", "gsm8k")}


@pytest.fixture(scope="session")
def mixtral_real_paths():
    missing = [str(p) for p in MIXTRAL_FILES.values() if not p.is_file()]
    if missing:
        pytest.skip(f"real Mixtral traces not found ({missing[0]}): ../shared is absent in this checkout")
    return MIXTRAL_FILES


@pytest.fixture(scope="session")
def mixtral_real(mixtral_real_paths, tmp_path_factory):
    """The two real Mixtral routing files imported (each alone, and both together), as trace paths."""
    from traces.importers.mixtral_jsonl import import_mixtral_jsonl
    from traces.io import save_trace

    d = tmp_path_factory.mktemp("mixtral")
    out = {}
    for name, path in mixtral_real_paths.items():
        trace, _ = import_mixtral_jsonl([path])
        out[name] = save_trace(trace, d / f"{name}.npz")
    trace, _ = import_mixtral_jsonl(list(mixtral_real_paths.values()))
    out["both"] = save_trace(trace, d / "both.npz")
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The validator's tiny model profile and a skewed random trace of it (so that caches hit and predictions
    miss): (profile path, trace path, trace). A module may override it with another seed."""
    return tiny_files(tmp_path_factory, 3)
