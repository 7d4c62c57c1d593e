"""`lookahead` (LRU that sees ``horizon`` iterations ahead): horizon 0 is lru exactly, a plain restatement of its rule
agrees on random traces, and on real routing one token of foresight beats lru (Belady's bound and the engine's
invariants, as for every policy: tests/sim/policies/test_policy_properties.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.config.run_config import load_run_config
from sim.core.workload import build_iterations
from sim.policies import POLICIES
from sim.run import simulate
from tests.reference.lookahead import plain_lookahead
from tests.support.paths import ROOT
from tests.support.policies import BOUNDED, TWO_LAYER_HAND_MADE, cache_hits, drive, policy_for, steps_of
from tests.support.traces import make_trace, random_trace


def lookahead_for(trace, its, cap, horizon, **params):
    return policy_for("lookahead", trace, its, 0, cap, {"horizon": horizon, **params})


@settings(max_examples=40, **BOUNDED)
@given(
    seed=st.integers(0, 10**6),
    cap=st.integers(1, 5),
    k=st.integers(1, 3),
    batch=st.integers(1, 3),
    pin_hot=st.booleans(),
)
def test_horizon_zero_makes_the_decisions_of_lru(seed, cap, k, batch, pin_hot):
    trace = random_trace(np.random.default_rng(seed), tokens=60, layers=2, experts=8, k=k, requests=3)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    look, look_snaps = drive(trace, its, lookahead_for(trace, its, cap, 0, pin_hot=pin_hot))
    lru, lru_snaps = drive(trace, its, policy_for("lru", trace, its, 0, cap, {"pin_hot": pin_hot}))
    assert look == lru and look_snaps == lru_snaps


@pytest.mark.parametrize("horizon", [1, 2, 5, 100])
@pytest.mark.parametrize("cap", [1, 2, 3])
def test_the_hand_made_trace_matches_the_plain_rule(horizon, cap):
    trace = make_trace(TWO_LAYER_HAND_MADE, lengths=[5, 6, 4], num_experts=8)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    _check_plain(trace, its, cap, horizon)


@settings(max_examples=40, **BOUNDED)
@given(
    seed=st.integers(0, 10**6),
    cap=st.integers(1, 5),
    k=st.integers(1, 3),
    batch=st.integers(1, 3),
    horizon=st.integers(1, 12),
)
def test_random_traces_match_the_plain_rule(seed, cap, k, batch, horizon):
    trace = random_trace(np.random.default_rng(seed), tokens=60, layers=2, experts=8, k=k, requests=3)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    _check_plain(trace, its, cap, horizon)


def _check_plain(trace, its, cap, horizon):
    pol = lookahead_for(trace, its, cap, horizon)
    _, snaps = drive(trace, its, pol, snapshot=lambda c: [list(m) for m in c.mpc])
    want_hits = 0
    for layer, steps in steps_of(trace, its).items():
        hits, after = plain_lookahead(steps, cap, horizon)
        want_hits += hits
        got = [s[layer] for s in snaps[layer :: trace.num_layers]]  # every layer runs in every iteration
        assert got == after, (layer, horizon, cap)
    assert cache_hits(pol) == want_hits


def test_one_token_of_foresight_beats_lru_on_real_routing():
    """On the bundled real gpt-oss-20b routing, knowing the next token's experts keeps more of them than lru."""
    hits = {}
    for policy, params in (("lru", []), ("lookahead", ["policy.params.horizon=1"])):
        cfg = load_run_config(
            ROOT / "configs/gpt_oss_20b.yaml",
            [
                f"policy.name={policy}",
                "policy.params={}",
                *params,
                "predictor.name=none",
                "workload.requests=6",
                "workload.max_decode_tokens=48",
            ],
        )
        s = simulate(cfg).summary
        hits[policy] = (s["hits"]["hpc"] + s["hits"]["mpc"]) / s["accesses"]
    assert hits["lookahead"] > hits["lru"] + 0.01, hits


@pytest.mark.parametrize("horizon", [-1, 1.5, None, "two"])
def test_a_bad_horizon_names_the_field(horizon):
    with pytest.raises(ConfigError, match="horizon"):
        POLICIES.get("lookahead").check_params({"horizon": horizon}, "policy.params")


def test_origin_is_bound():
    assert POLICIES.get("lookahead").origin == "bound"


def test_the_foresight_study_runs_and_its_table_is_consistent(tmp_path):
    """``benchmarks/foresight_study.py --quick`` end to end: one row per cell, the target between the best published
    cache and Belady, and Belady's cache hits at least every lookahead horizon's."""
    import subprocess
    import sys

    doc = tmp_path / "foresight.md"
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "foresight_study.py"), "--quick", "--jobs", "2", "--doc", str(doc)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [
        line.split("|")[1:-1]
        for line in doc.read_text().splitlines()
        if line.startswith("| ") and line.split("|")[2].strip() in ("1", "16")
    ]
    assert len(rows) == 6
    for row in rows:
        best, bel, target = float(row[2].split()[0]), float(row[3]), float(row[4])
        looks = [float(x) for x in row[6].split("/")]
        assert len(looks) == 5 and best <= target <= bel
        assert all(v <= bel + 1e-9 for v in looks)
