"""`lru` and `lfu` as plain baselines (Mixtral-offloading's per-layer cache): no pinned experts by default, the
whole ``hpc_slots + mpc_slots`` of a layer as one cache; ``pin_hot`` pins the hottest experts in the HPC and
caches in the ``mpc_slots`` others. Which LFU (``counts``: perfect or in-cache), against plain restatements."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.core.cache import HPC, LPC, MISS, MPC
from sim.core.workload import build_iterations
from sim.decisions.replay import replay
from sim.predictors import PREDICTORS, PredictorContext
from tests.reference.lfu import plain_lfu
from tests.reference.lru import plain_lru
from tests.support.policies import indexed_steps_of, policy_for
from tests.support.traces import random_trace


def run(trace, its, policy, predictor="none"):
    pred = PREDICTORS.get(predictor)(
        {"recall": 0.7, "precision": 0.6} if predictor == "noisy" else None,
        PredictorContext(trace.num_layers, trace.num_experts, 0),
    )
    return replay(trace, its, policy, pred, after_step=lambda p: p.cache.check())


# ------------------------------------------------------------------------------------------------ capacity


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    hpc=st.integers(0, 3),
    mpc=st.integers(0, 4),
    k=st.integers(1, 3),
    batch=st.integers(1, 3),
    pin_hot=st.booleans(),
)
def test_lru_capacity_is_hpc_plus_mpc_unless_pinned(seed, hpc, mpc, k, batch, pin_hot):
    trace = random_trace(np.random.default_rng(seed), tokens=60, layers=2, experts=10, k=k, requests=3)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    pol = policy_for("lru", trace, its, hpc, mpc, None if not pin_hot else {"pin_hot": True})
    decisions = run(trace, its, pol)
    c = pol.cache.counters
    assert (
        c.accesses
        == sum(len(d.active) for d in decisions)
        == int(sum(len(s) for steps in indexed_steps_of(trace, its).values() for _, s in steps))
    )
    steps = indexed_steps_of(trace, its)
    if pin_hot:
        assert (pol.cache.hpc_slots, pol.cache.mpc_slots) == (hpc, mpc)
        hot = [set(pol.ctx.hot_ranking[layer][:hpc]) for layer in range(trace.num_layers)]
        assert list(pol.cache.hpc) == [frozenset(h) for h in hot]
        # the pinned experts never reach the LRU part: LRU runs on the other experts only
        want_mpc = (
            sum(
                plain_lru([(t, [e for e in s if e not in hot[layer]]) for t, s in st_], mpc)
                for layer, st_ in steps.items()
            )
            if mpc
            else 0
        )
        want_hpc = sum(len([e for e in s if e in hot[layer]]) for layer, st_ in steps.items() for _, s in st_)
        assert (c.hits[HPC], c.hits[MPC]) == (want_hpc, want_mpc)
    else:
        assert (pol.cache.hpc_slots, pol.cache.mpc_slots) == (0, hpc + mpc)
        assert not any(pol.cache.hpc)
        cap = hpc + mpc
        assert c.hits[HPC] == 0
        assert c.hits[MPC] == (sum(plain_lru(st_, cap) for st_ in steps.values()) if cap else 0)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    hpc=st.integers(0, 3),
    mpc=st.integers(0, 3),
    k=st.integers(1, 3),
    batch=st.integers(1, 3),
)
def test_an_unpinned_cache_is_the_same_for_any_split_of_its_slots(seed, hpc, mpc, k, batch):
    """Without pin_hot only hpc_slots + mpc_slots matters (equal-slot comparisons stay fair)."""
    trace = random_trace(np.random.default_rng(seed), tokens=50, layers=2, experts=8, k=k, requests=3)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    for name in ("lru", "lfu"):
        a = policy_for(name, trace, its, hpc, mpc)
        b = policy_for(name, trace, its, 0, hpc + mpc)
        assert [d.sources for d in run(trace, its, a)] == [d.sources for d in run(trace, its, b)]


# ---------------------------------------------------------------------------------------------------- LFU


@pytest.mark.parametrize("counts", ["perfect", "in_cache"])
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), cap=st.integers(1, 5), batch=st.integers(1, 3), k=st.integers(1, 3))
def test_lfu_matches_a_plain_restatement_of_each_kind(counts, seed, cap, batch, k):
    trace = random_trace(np.random.default_rng(seed), tokens=80, layers=2, experts=10, k=k, requests=4)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    pol = policy_for("lfu", trace, its, 0, cap, {"counts": counts})
    snaps = []
    decisions = replay(
        trace,
        its,
        pol,
        PREDICTORS.get("none")(None, PredictorContext(2, 10, 0)),
        after_step=lambda p: snaps.append([sorted(m) for m in p.cache.mpc]),
    )
    want = {layer: iter(plain_lfu(s, cap, counts == "in_cache")) for layer, s in indexed_steps_of(trace, its).items()}
    for d, snap in zip(decisions, snaps):
        src, after = next(want[d.layer])
        assert dict(d.sources) == src
        assert snap[d.layer] == after


def test_perfect_and_in_cache_lfu_differ():
    """An expert popular long ago keeps its count under perfect LFU (and its slot); in-cache LFU forgets."""
    trace = random_trace(np.random.default_rng(3), tokens=200, layers=1, experts=8, k=2, requests=1)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    out = {}
    for counts in ("perfect", "in_cache"):
        pol = policy_for("lfu", trace, its, 0, 3, {"counts": counts})
        out[counts] = [d.sources for d in run(trace, its, pol)]
    assert out["perfect"] != out["in_cache"]


# ------------------------------------------------------------------------------------------------- params


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("lfu", {"counts": "ever"}, "policy.params.counts"),
        ("lfu", {"pin_hot": 1}, "policy.params.pin_hot"),
        ("lru", {"pin_hot": "yes"}, "policy.params.pin_hot"),
        ("lru", {"counts": "perfect"}, "policy.params.counts"),  # lru has no counts
    ],
)
def test_bad_params_name_the_field(name, params, field):
    trace = random_trace(np.random.default_rng(0), tokens=10, layers=2, experts=8, k=2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    with pytest.raises(ConfigError, match="^" + field.replace(".", r"\.") + ":"):
        policy_for(name, trace, its, 1, 2, params)


def test_lru_default_keeps_no_pinned_experts_and_starts_empty():
    trace = random_trace(np.random.default_rng(0), tokens=10, layers=2, experts=8, k=2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    for name in ("lru", "lfu"):
        pol = policy_for(name, trace, its, 2, 3)
        assert pol.params["pin_hot"] is False
        assert not any(pol.cache.hpc) and not any(pol.cache.mpc)
        d = run(trace, its, pol)[0]
        assert all(s == MISS for _, s in d.sources) and LPC not in dict(d.sources).values()
