"""``validate.measure.measure`` over several rounds: calibration passes where they are due, each configuration run
once per round, ``--resume`` keeping the rounds already measured, light passes between configurations."""

from __future__ import annotations

import json

import pytest

import validate.measure as measure_mod
from tests.support.validate import tiny_suite


@pytest.fixture
def two_point_suite(tiny, monkeypatch):
    suite = tiny_suite(tiny, (("lru-b2", "lru", "none", 2, 0, 2), ("gpu-only-b2", "gpu-only", "none", 2, 0, 0)), 2)
    monkeypatch.setattr(measure_mod, "SUITES", {"cpu": suite})
    return suite


def _run(out, log, **kw):
    return measure_mod.measure("cpu", out, "cpu", repeat=1, host_threads=1, log=log, **kw)


def test_rounds_calibrate_before_each_and_after_the_last_and_resume_keeps_what_was_measured(two_point_suite, tmp_path):
    said: list[str] = []
    out = _run(tmp_path / "m", said.append, rounds=2, calibrate_between=True)
    runs = [line.split(":")[0] for line in said if line.startswith("[")]
    assert runs == ["[1/4] lru-b2 round 1/2", "[2/4] gpu-only-b2 round 1/2", "[3/4] lru-b2 round 2/2",
                    "[4/4] gpu-only-b2 round 2/2"]  # fmt: skip
    passes = [line for line in said if line.startswith("calibration") and "done in" in line]
    # a full pass before each round and after the last, a light one after each configuration
    assert len(passes) == 3 + 4 and sum("light pass" in p for p in passes) == 4
    assert len(json.loads((out / "calibration-passes.json").read_text())) == 7
    for name in ("lru-b2", "gpu-only-b2"):
        s = json.loads((out / "runs" / name / "summary.json").read_text())
        assert s["rounds"] == 2
        assert all((out / "runs" / name / f"round-{r}" / "summary.json").exists() for r in (0, 1))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rounds"] == 2 and manifest["calibrate_between"] and "machine_after" in manifest

    (out / "runs" / "gpu-only-b2" / "round-1" / "summary.json").unlink()
    said.clear()
    _run(out, said.append, rounds=2, resume=True)
    kept = [line for line in said if line.endswith("kept (--resume)")]
    assert len(kept) == 3 and not any("gpu-only-b2 round 2/2: kept" in line for line in kept)
    assert (out / "runs" / "gpu-only-b2" / "round-1" / "summary.json").exists()
    # the full passes already made count: none before the rounds, one after the last (rounds > 1)
    assert [line for line in said if "done in" in line] == [
        line for line in said if line.startswith("calibration (after the last round)")
    ]
