"""Step-wise LRU (`traces stats` lru_hit_rate): against a slow replay, the simulator's own `lru` policy, and the
identity with the previous token's overlap at k slots."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference.lru import plain_lru
from tests.support.policies import policy_for
from tests.support.real_traces import gpt_oss
from tests.support.traces import make_trace, random_trace
from traces.analysis import stats, step_lru


def replay_step_lru(trace, capacity):
    """A plain replay, one layer at a time, of the rule in sim/policies/lru.py at batch 1 (one token per step),
    through the suite's LRU re-statement (``conftest.plain_lru``). Returns (hits, accesses) per layer."""
    hits, accesses = [], []
    for layer in range(trace.num_layers):
        steps = [(t, {int(x) for x in trace.experts[t, layer] if x >= 0}) for t in range(trace.num_tokens)]
        hits.append(plain_lru(steps, capacity))
        accesses.append(sum(len(act) for _, act in steps))
    return hits, accesses


@st.composite
def traces_with_holes(draw):
    """Random routing, some tokens skewed towards low ids, some slots (or whole rows) without routing."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    experts = draw(st.integers(2, 10))
    k = draw(st.integers(1, min(4, experts)))
    t = random_trace(
        rng, tokens=draw(st.integers(2, 70)), layers=draw(st.integers(1, 3)), experts=experts, k=k, requests=2
    )
    if draw(st.booleans()):  # popular experts, so that reuse is frequent
        t.experts[:] = np.sort(np.argsort(rng.random(t.experts.shape[:2] + (experts,)) ** 3, axis=2)[:, :, :k], 2)
    t.experts[rng.random(t.experts.shape) < draw(st.sampled_from([0.0, 0.1, 0.3]))] = -1
    return t


@settings(max_examples=80, deadline=None)
@given(traces_with_holes())
def test_step_lru_matches_a_slow_replay(trace):
    caps = list(range(1, trace.num_experts + 2))
    overall, per_layer = stats.step_lru_hit_rates(trace, caps)
    for c in caps:
        hits, accesses = replay_step_lru(trace, c)
        if sum(accesses) == 0:
            assert np.isnan(overall[c])
            continue
        assert overall[c] == pytest.approx(sum(hits) / sum(accesses), abs=1e-12)
        for layer in range(trace.num_layers):
            if accesses[layer]:
                assert per_layer[layer][c] == pytest.approx(hits[layer] / accesses[layer], abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(traces_with_holes(), st.integers(1, 5))
def test_chain_and_fixed_point_agree_below_k_slots(trace, capacity):
    """Below k slots a trace without holes goes through the chain of cache states; forcing the fixed-point
    iteration instead must give the same hits."""
    caps = [capacity]
    chain, _ = step_lru.layer_hits(trace.experts, trace.num_experts, caps)
    old = step_lru._MAX_CHAIN_STATES
    try:
        step_lru._MAX_CHAIN_STATES = 0
        fixed_point, _ = step_lru.layer_hits(trace.experts, trace.num_experts, caps)
    finally:
        step_lru._MAX_CHAIN_STATES = old
    assert chain.tolist() == fixed_point.tolist()


def test_long_traces_cross_table_chunks_and_chain_blocks(monkeypatch):
    monkeypatch.setattr(step_lru, "_TABLE_CELLS", 64)  # a few steps per last-use table chunk
    rng = np.random.default_rng(4)
    t = random_trace(rng, tokens=700, layers=2, experts=9, k=3, requests=5)
    t.experts[:] = np.sort(np.argsort(rng.random(t.experts.shape[:2] + (9,)) ** 2, axis=2)[:, :, :3], 2)
    for c in (1, 2, 3, 5, 8):
        hits, accesses = replay_step_lru(t, c)
        assert stats.step_lru_hit_rates(t, [c])[0][c] == pytest.approx(sum(hits) / sum(accesses), abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), capacity=st.integers(1, 7), k=st.integers(1, 3))
def test_step_lru_is_what_the_simulators_lru_policy_hits(seed, capacity, k):
    from sim.core.cache import MPC
    from sim.core.workload import build_iterations
    from sim.decisions.replay import replay
    from sim.predictors import PREDICTORS, PredictorContext

    trace = random_trace(np.random.default_rng(seed), tokens=60, layers=2, experts=8, k=k, requests=2)
    policy = policy_for("lru", trace, None, 0, capacity)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    replay(trace, its, policy, PREDICTORS.get("none")(None, PredictorContext(trace.num_layers, 8, 0)))
    c = policy.cache.counters
    hits, _ = step_lru.layer_hits(trace.experts, trace.num_experts, [capacity])
    assert c.hits[MPC] == int(hits.sum()) and c.accesses == int((trace.experts >= 0).sum())


def file_order_overlap(trace):
    """Share of accesses whose expert the previous row of the file (any request) used in the same layer."""
    cur, prev = trace.experts[1:], trace.experts[:-1]
    shared = ((cur[..., :, None] == prev[..., None, :]) & (cur[..., None] >= 0)).any(-1).sum()
    return shared / (trace.experts >= 0).sum()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), experts=st.integers(2, 12), k=st.integers(1, 4), requests=st.integers(1, 4))
def test_k_slots_hit_exactly_what_the_previous_token_shares(seed, experts, k, requests):
    """With k slots the cache after a full step holds exactly that step's experts."""
    k = min(k, experts)
    trace = random_trace(np.random.default_rng(seed), tokens=50, layers=2, experts=experts, k=k, requests=requests)
    hit_rate = stats.step_lru_hit_rates(trace, [k])[0][k]
    assert hit_rate == pytest.approx(file_order_overlap(trace), abs=1e-12)
    if requests == 1:  # the overlap figure of traces stats averages over the tokens that have a previous one
        assert hit_rate == pytest.approx(stats.overlap_prev(trace)[0] * 49 / 50, abs=1e-12)


def test_top1_step_wise_equals_sequential_and_top_k_is_far_higher_near_k_slots():
    rng = np.random.default_rng(8)
    top1 = random_trace(rng, tokens=300, layers=2, experts=10, k=1, requests=3)
    s = stats.compute_stats(top1, capacities=[1, 2, 4], batch_sizes=[1])
    assert s["lru_hit_rate"] == s["lru_hit_rate_sequential"]
    hists = stats.reuse_profile(top1)
    step = step_lru.layer_hits(top1.experts, 10, [1, 2, 4])[0].sum(0) / (top1.experts >= 0).sum()
    assert step.tolist() == pytest.approx([stats.lru_hit_rates(hists, [c])[0][c] for c in (1, 2, 4)])
    # top-4 of 8 with 4 slots: sequentially a token's 4 experts evict each other's predecessors
    sticky = make_trace(np.tile(np.array([[0, 1, 2, 3]]), (40, 1))[:, None, :], num_experts=8)
    s4 = stats.compute_stats(sticky, capacities=[4], batch_sizes=[1])
    assert s4["lru_hit_rate"]["4"] == pytest.approx(39 / 40) and s4["lru_hit_rate_sequential"]["4"] == 39 / 40
    rotating = make_trace(np.array([[0, 1, 2, 3], [1, 2, 3, 4]] * 20)[:, None, :], num_experts=8)
    r4 = stats.compute_stats(rotating, capacities=[4], batch_sizes=[1])
    assert r4["lru_hit_rate"]["4"] == pytest.approx(39 * 3 / 160)
    assert r4["lru_hit_rate_sequential"]["4"] < r4["lru_hit_rate"]["4"]


def test_stats_output_names_both_figures(tmp_path):
    import json
    import subprocess
    import sys

    from tests.support.paths import ROOT
    from traces.io import save_trace

    path = save_trace(random_trace(np.random.default_rng(2), tokens=200, layers=2, experts=8, k=2), tmp_path / "t.npz")
    out = subprocess.run(
        [sys.executable, "-m", "traces", "stats", str(path), "--json", "--capacities", "2,4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    s = json.loads(out)
    assert set(s["lru_hit_rate"]) == set(s["lru_hit_rate_sequential"]) == {"2", "4"}
    assert all("lru_hit_rate_sequential" in p for p in s["per_layer"])
    text = stats.format_stats(
        stats.compute_stats(stats_trace := random_trace(np.random.default_rng(3)), capacities=[2, 4], batch_sizes=[1])
    )
    assert "step-wise" in text and "sequential" in text and stats_trace.num_layers == 3


@pytest.mark.slow
def test_real_gpt_oss_step_wise_lru_at_4_slots_is_the_file_order_overlap():
    trace = gpt_oss()
    start = time.perf_counter()
    overall, per_layer = stats.step_lru_hit_rates(trace, [4, 8, 16])
    seconds = time.perf_counter() - start
    overlap = stats.overlap_prev(trace)[0]
    print(
        f"\ngpt-oss-20b: step-wise LRU hit rate at 4/8/16 slots {overall[4]:.4f} / {overall[8]:.4f} / "
        f"{overall[16]:.4f}, overlap with the previous token {overlap:.4f}, step-wise LRU in {seconds:.1f} s"
    )
    assert overall[4] == pytest.approx(file_order_overlap(trace), abs=1e-12)
    assert overall[4] < overall[8] < overall[16] < 1
    assert seconds < 120  # a few seconds on one core; a loose bound for a shared machine
