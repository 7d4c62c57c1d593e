"""`sim compare --policies all`: every registered policy, each with the same predictor (or with its own under
``--own-predictors``), and the `origin` column."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import yaml

from sim.compare import ORIGINS, all_entries, default_predictor, origin_of, parse_entries
from sim.policies import POLICIES, Policy
from tests.support.configs import tiny_lru_config
from tests.support.paths import ROOT

#: What each policy is: the gpu-only ceiling, a baseline, published, ours, or an offline bound (new policies
#: declare it in their class).
EXPECTED_ORIGINS = {
    "gpu-only": "ceiling",
    "on-demand": "baseline",
    "prefetch-all": "baseline",
    "pregated": "baseline",
    "lru": "published",
    "lfu": "published",
    "moe-infinity": "published",
    "diffmoe": "published",
    "arc": "published",
    "s3fifo": "published",
    "least-stale": "published",
    "learned-rf": "published",
    "reuse-distance": "published",
    "diffmoe-arc": "ours",
    "next-use-odds": "ours",
    "belady": "bound",
    "fiddler": "published",
    "ktransformers": "published",
    "hybrid-cache": "ours",
}


def test_every_registered_policy_has_an_origin_and_runs_without_params():
    """``--policies all`` runs every policy with empty params: none may require one."""
    for name in POLICIES.names():
        assert origin_of(name) in ORIGINS, name
        assert origin_of(POLICIES.get(name)) == origin_of(name)
        POLICIES.get(name).check_params({})
    for name, origin in EXPECTED_ORIGINS.items():
        assert origin_of(name) == origin, name


def test_the_origin_is_the_class_declaration():
    class Mine(Policy):
        name = "lru"  # a registered name does not lend its origin
        origin = "ours"

    class Unknown(Policy):
        name = "lru"

    assert origin_of(Mine) == "ours"
    assert origin_of(Unknown) is None


def test_all_expands_to_every_policy_by_origin_with_one_predictor_or_their_own():
    entries = all_entries()
    names = [p for p, _ in entries]
    assert sorted(names) == POLICIES.names() and len(set(names)) == len(names)
    ranks = [ORIGINS.index(origin_of(p)) for p in names]
    assert ranks == sorted(ranks)
    assert names[0] == "gpu-only" and names[-1] == "belady"
    pred = dict(entries)
    assert pred["moe-infinity"] == "moe-infinity"
    assert pred["pregated"] == pred["diffmoe"] == pred["diffmoe-arc"] == "oracle"
    assert all(
        pred[p] is None
        for p in ("lru", "lfu", "arc", "s3fifo", "least-stale", "learned-rf", "reuse-distance", "belady", "on-demand")
    )
    assert default_predictor("lru") is None
    assert parse_entries("all", own_predictors=True) == entries
    assert parse_entries("all") == [(p, None) for p in names]  # the config's predictor, the same for all
    assert parse_entries("all,lru@oracle") == [(p, None) for p in names] + [("lru", "oracle")]


@pytest.fixture()
def tiny_config(tmp_path):
    return tiny_lru_config(tmp_path, tokens=36)


def test_compare_all_runs_every_policy_and_writes_the_origin_column(tiny_config, tmp_path):
    out = tmp_path / "cmp"
    res = subprocess.run(
        [sys.executable, "-m", "sim", "compare", str(tiny_config), "--policies", "all", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["policy"] for r in rows] == [p for p, _ in all_entries()]
    by = {r["policy"]: r for r in rows}
    assert {p: r["origin"] for p, r in by.items()} == {p: origin_of(p) for p in POLICIES.names()}
    for p, origin in EXPECTED_ORIGINS.items():
        assert by[p]["origin"] == origin
    # the config's predictor (none) for every policy that reads one; no predictor for the others
    uses = {p: POLICIES.get(p).reads_predictions(POLICIES.get(p).check_params({})) for p in by}
    assert {p: r["predictor"] for p, r in by.items()} == dict.fromkeys(by, "none")
    assert {p: r["uses_predictor"] for p, r in by.items()} == {p: str(u) for p, u in uses.items()}
    assert not uses["gpu-only"] and not uses["on-demand"] and not uses["fiddler"] and uses["lru"]
    assert float(by["on-demand"]["ratio_vs_baseline"]) == 1.0
    bound = float(by["belady"]["cache_hit_rate"])
    assert bound == pytest.approx(float(by["belady"]["belady_cache_hit_rate"]))
    for p, r in by.items():  # the offline optimum bounds every policy at the same slots (gpu-only keeps all)
        if p != "gpu-only":
            assert float(r["cache_hit_rate"]) <= bound + 1e-12, p
    md = (out / "compare.md").read_text()
    assert "| policy | predictor | origin |" in md
    assert "| arc | none | published |" in md and "| diffmoe-arc | none | ours |" in md
    assert "| gpu-only | - | ceiling |" in md and "| belady | none | bound |" in md
    # every entry of `all` ran with the config's predictor, said in one line under the table
    note = md.splitlines()[-2]
    assert note.startswith("every policy that reads a predictor ran with the same one, the config's predictor none")
    assert "diffmoe@oracle" in note and "moe-infinity@moe-infinity" in note and note in res.stdout


def test_compare_all_on_a_shared_cache_runs_the_shared_policies_against_the_shared_bound(tiny_config, tmp_path):
    """The config's own policy may manage per-layer slots only: ``all`` leaves out those that do, and the bound is
    the shared MIN cache of the same total size."""
    from sim.config.run_config import load_run_config
    from sim.core.workload import build_iterations
    from sim.policies.belady import belady_bound_shared
    from traces.io import load_trace

    cfg = yaml.safe_load(tiny_config.read_text())
    cfg["policy"] = {"name": "diffmoe", "params": {}}
    tiny_config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "cmp"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "compare",
            str(tiny_config),
            "--policies",
            "all",
            "--out",
            str(out),
            "--set",
            "cache.organization=shared",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert "leaving out" in res.stderr and "diffmoe" in res.stderr
    rows = {r["policy"]: r for r in csv.DictReader((out / "compare.csv").open())}
    assert set(rows) == {p for p in POLICIES.names() if POLICIES.get(p).supports_shared}
    assert "diffmoe" not in rows and "lru" in rows and "belady" in rows
    base = load_run_config(tiny_config, ["cache.organization=shared", "policy.name=lru"])
    trace = load_trace(base.workload.trace)
    its, _ = build_iterations(trace, 2, "static", None, True, None)
    bound = belady_bound_shared(trace, its, base.cache.total_slots(trace.num_layers))["hit_rate"]
    assert float(rows["belady"]["belady_cache_hit_rate"]) == pytest.approx(bound)
    assert float(rows["belady"]["cache_hit_rate"]) == pytest.approx(bound)
    for p, r in rows.items():
        if p != "gpu-only":
            assert float(r["cache_hit_rate"]) <= bound + 1e-12, p
    assert "shared by 2 layers" in (out / "compare.md").read_text()
