"""`sim compare` and our policy `diffmoe-arc`."""

from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, make_trace, random_trace
from sim.cache import MPC
from test_policies import make_policy, run_decisions


def _sim(*args):
    return subprocess.run([sys.executable, "-m", "sim", *map(str, args)], cwd=ROOT, capture_output=True, text=True)


def test_compare_writes_csv_and_markdown_with_ratios_and_the_belady_bound(tmp_path):
    out = tmp_path / "cmp"
    res = _sim("compare", "configs/switch_xxl.yaml", "--policies", "gpu-only,on-demand,lru@none,diffmoe",
               "--set", "workload.requests=16", "--set", "workload.max_decode_tokens=16", "--out", out)
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader((out / "compare.csv").open()))
    by = {r["policy"]: r for r in rows}
    assert [r["policy"] for r in rows] == ["gpu-only", "on-demand", "lru", "diffmoe"]
    assert float(by["on-demand"]["ratio_vs_baseline"]) == 1.0
    assert by["lru"]["predictor"] == "none" and by["diffmoe"]["predictor"] == "oracle"
    tput = {p: float(r["throughput_tok_s"]) for p, r in by.items()}
    assert all(tput["gpu-only"] >= t for t in tput.values())
    for p in ("lru", "diffmoe"):  # no policy beats the offline optimum in cache hits at equal slots
        assert float(by[p]["belady_cache_hit_rate"]) >= float(by[p]["cache_hit_rate"]) - 1e-12
        assert abs(float(by[p]["ratio_vs_baseline"]) - tput[p] / tput["on-demand"]) < 1e-4
    md = (out / "compare.md").read_text()
    assert "| lru | none |" in md and "x on-demand" in md


def test_compare_rejects_unknown_names_before_running(tmp_path):
    out = tmp_path / "cmp"
    for policies, word in (("lru,clairvoyant", "clairvoyant"), ("lru@psychic", "psychic")):
        res = _sim("compare", "configs/switch_xxl.yaml", "--policies", policies, "--out", out)
        assert res.returncode == 2 and word in res.stderr and res.stderr.count("\n") == 1
    res = _sim("compare", "configs/switch_xxl.yaml", "--policies", "lru", "--baseline", "diffmoe", "--out", out,
               "--set", "workload.requests=16", "--set", "workload.max_decode_tokens=4")
    assert res.returncode == 2 and "--baseline" in res.stderr
    assert not (out / "compare.csv").exists()


# ------------------------------------------------------------------------------------------------ diffmoe-arc

def _arc_consistent(policy):
    for layer, arc in policy.arc.items():
        assert set(arc.t1) | set(arc.t2) == set(policy.cache.mpc[layer])  # T1 + T2 is exactly the MPC
        assert not (set(arc.t1) & set(arc.t2)) and len(arc.t1) + len(arc.t2) <= arc.c
        assert not ((set(arc.b1) | set(arc.b2)) & set(policy.cache.mpc[layer]))  # ghosts are not cached
        assert len(arc.b1) + len(arc.b2) <= 2 * arc.c and 0 <= arc.p <= arc.c


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), hpc=st.integers(0, 2), mpc=st.integers(0, 5), k=st.integers(1, 3),
       batch=st.integers(1, 3))
def test_diffmoe_arc_keeps_its_lists_and_the_tiers_consistent(seed, hpc, mpc, k, batch):
    trace = random_trace(np.random.default_rng(seed), tokens=80, layers=2, experts=10, k=k, requests=3)
    policy = make_policy("diffmoe-arc", trace, hpc=hpc, mpc=mpc)
    from sim.predictors import PREDICTORS, PredictorContext
    from sim.replay import replay
    from sim.workload import build_iterations

    its, _ = build_iterations(trace, batch, "static", None, True, None)
    none = PREDICTORS.get("none")(None, PredictorContext(trace.num_layers, trace.num_experts))

    def check(p):
        p.cache.check()
        _arc_consistent(p)

    replay(trace, its, policy, none, after_step=check)


def test_diffmoe_arc_resists_a_scan_that_flushes_lru():
    """Two hot experts used again and again, then a one-time scan of new experts, then the hot ones again: ARC
    keeps them (they sit in its frequency list), LRU of the same size loses them to the scan."""
    seq = [0, 1] * 6 + list(range(2, 9)) + [0, 1] * 3
    trace = make_trace([[e] for e in seq], num_experts=10)
    ranking = [tuple(range(10))]
    arc = make_policy("diffmoe-arc", trace, hpc=0, mpc=3, ranking=ranking)
    lru = make_policy("lru", trace, hpc=0, mpc=3, ranking=ranking)
    da, dl = run_decisions(trace, arc), run_decisions(trace, lru)
    after_scan = slice(len(seq) - 6, len(seq))
    arc_hits = sum(src == MPC for d in da[after_scan] for _, src in d.sources)
    lru_hits = sum(src == MPC for d in dl[after_scan] for _, src in d.sources)
    assert lru_hits == 4 and arc_hits == 6
