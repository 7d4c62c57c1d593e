"""docs/serving.md tells the truth about the capacity study: its commands are those benchmarks/serving_capacity.py
runs, its table is the one the script prints from the committed results (docs/serving/*.json), and the figures its
findings quote are in those results."""

from __future__ import annotations

import importlib.util
import json
import re

from tests.support.paths import ROOT

DOC = (ROOT / "docs" / "serving.md").read_text()
WORDS = " ".join(re.sub(r"^ *```.*?^ *```", "", DOC, flags=re.M | re.S).split()).replace("**", "")


def _study():
    spec = importlib.util.spec_from_file_location("serving_capacity", ROOT / "benchmarks" / "serving_capacity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_study_is_the_committed_results():
    study = _study()
    docs = {}
    for name in study.POLICIES:
        command = "python -m sim " + " ".join(study.command(name, ROOT / "docs" / "serving"))
        assert command.replace(f"{ROOT}/", "") in DOC, name
        docs[name] = json.loads((ROOT / "docs" / "serving" / f"{name}.json").read_text())
        assert docs[name]["check"]["holds"] and not docs[name]["above_saturation"], name
        assert (ROOT / "docs" / "serving" / f"{name}.png").exists()
    assert study.table(docs) in DOC
    d, lru, gpu = (docs[n]["max_rate_per_s"] for n in ("diffmoe", "lru", "gpu-only"))
    assert round(gpu / d) == 15 and "fifteenfold" in WORDS
    assert f"{d:.2f} requests/s with Diff-MoE against {gpu:.2f}" in WORDS
    assert f"holds {100 * (d / lru - 1):.1f}% more than LRU ({d:.2f} against {lru:.2f} requests/s)" in WORDS
    above = sorted(docs[n]["check"]["above"]["attainment"] for n in docs)
    assert f"for {100 * above[0]:.1f}-{100 * above[-1]:.1f}% of them" in WORDS
    at = {n: study.at_capacity(doc) for n, doc in docs.items()}
    assert f"GPU computes {100 * at['gpu-only']['compute_busy_frac']:.1f}% of the time at capacity" in WORDS
    assert f"link is busy {100 * at['diffmoe']['link_busy_frac']:.1f}% of the time" in WORDS
    assert (
        f"LRU's is {at['lru']['hit_rate']:.3f} of accesses at its capacity, Diff-MoE's {at['diffmoe']['hit_rate']:.3f}"
        in WORDS
    )
    probe = docs["gpu-only"]["saturation_req_s"]
    assert f"({gpu:.2f}) lies {100 * (gpu / probe - 1):.0f}% above the {probe:.2f} of its probe" in WORDS
