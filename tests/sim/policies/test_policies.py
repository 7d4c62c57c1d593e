"""Policies and predictors (plain Python, no engine; sim/policies/lru.py, diffmoe.py, base.py's params): checked against
independent re-statements of their rules (the tiers every policy keeps:
tests/sim/policies/test_policy_properties.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.cache import HPC, LPC, MISS, MPC
from sim.core.workload import build_iterations
from sim.decisions.replay import replay
from tests.reference.diffmoe import LEGACY, plain_diffmoe
from tests.reference.lru import plain_lru_hits
from tests.support.policies import ONE_LAYER_HAND_MADE, policy_for, predictor_for, run_decisions
from tests.support.traces import make_trace, random_trace
from traces.analysis import stats

# ------------------------------------------------------------------------------------------------------ LRU


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), capacity=st.integers(1, 7), k=st.integers(1, 3))
def test_lru_matches_a_plain_list_lru_at_batch_1(seed, capacity, k):
    trace = random_trace(np.random.default_rng(seed), tokens=60, layers=2, experts=8, k=k, requests=2)
    policy = policy_for("lru", trace, hpc=0, mpc=capacity)
    run_decisions(trace, policy)
    c = policy.cache.counters
    assert c.hits[MPC] == plain_lru_hits(trace, capacity)
    assert c.hits[HPC] == 0 and c.hits[LPC] == 0
    assert c.accesses == int((trace.experts >= 0).sum())


def test_lru_top1_hit_rate_equals_the_stack_distance_figure_of_traces_stats():
    rng = np.random.default_rng(5)
    trace = random_trace(rng, tokens=400, layers=3, experts=12, k=1, requests=4)
    for cap in (1, 3, 6):
        policy = policy_for("lru", trace, hpc=0, mpc=cap)
        run_decisions(trace, policy)
        want, _ = stats.lru_hit_rates(stats.reuse_profile(trace), [cap])
        assert policy.cache.counters.hits[MPC] / policy.cache.counters.accesses == pytest.approx(want[cap])


# -------------------------------------------------------------------------------------------------- Diff-MoE


def legacy_vs_plain(trace, hpc, mpc):
    ranking = [tuple(range(trace.num_experts))] * trace.num_layers
    policy = policy_for("diffmoe", trace, hpc=hpc, mpc=mpc, ranking=ranking, params=LEGACY)
    snapshots = []  # MPC of every layer after each (token, layer) step
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    decisions = replay(
        trace,
        its,
        policy,
        predictor_for("none", trace),
        after_step=lambda p: snapshots.append([sorted(m) for m in p.cache.mpc]),
    )
    mpc_after = [snap[d.layer] for snap, d in zip(snapshots, decisions)]
    want = plain_diffmoe(trace, hpc, mpc, ranking)
    assert [dict(d.sources) for d in decisions] == [w[0] for w in want]
    assert mpc_after == [w[1] for w in want]
    return policy


@pytest.mark.parametrize("experts", [ONE_LAYER_HAND_MADE, "random"])
def test_diffmoe_legacy_params_reproduce_the_earlier_rules(experts):
    if experts == "random":
        trace = random_trace(np.random.default_rng(11), tokens=120, layers=2, experts=10, k=2, requests=1)
    else:
        trace = make_trace(ONE_LAYER_HAND_MADE, num_experts=6)
    policy = legacy_vs_plain(trace, 1, 2)
    assert policy.cache.counters.promotions > 0 and policy.cache.counters.hits[MPC] > 0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), hpc=st.integers(0, 2), mpc=st.integers(0, 3), k=st.integers(1, 3))
def test_diffmoe_legacy_params_reproduce_the_old_rules_on_random_traces(seed, hpc, mpc, k):
    trace = random_trace(np.random.default_rng(seed), tokens=60, layers=2, experts=8, k=k, requests=1)
    legacy_vs_plain(trace, hpc, mpc)


def test_diffmoe_default_is_not_the_legacy_rule():
    """The artifact's rules (no floor) promote less: on this trace the legacy rules promote where they do not."""
    trace = random_trace(np.random.default_rng(11), tokens=120, layers=2, experts=10, k=2, requests=1)
    ranking = [tuple(range(trace.num_experts))] * trace.num_layers
    new = policy_for("diffmoe", trace, hpc=1, mpc=2, ranking=ranking)
    old = policy_for("diffmoe", trace, hpc=1, mpc=2, ranking=ranking, params=LEGACY)
    run_decisions(trace, new)
    run_decisions(trace, old)
    assert new.cache.counters.promotions < old.cache.counters.promotions


def test_diffmoe_start_of_batch_state_and_hpc_never_change():
    trace = random_trace(np.random.default_rng(2), tokens=200, layers=2, experts=16, k=2, requests=4)
    policy = policy_for("diffmoe", trace, hpc=3, mpc=4)
    ranking = policy.ctx.hot_ranking
    policy.start_batch()
    for layer in range(2):
        assert policy.cache.hpc[layer] == frozenset(ranking[layer][:3])
        assert list(policy.cache.mpc[layer]) == list(ranking[layer][3:7])
        assert (policy.scores[layer, list(ranking[layer][:7])] == 2.0).all()
        assert policy.scores[layer].sum() == pytest.approx(14.0)
    hpc_before = list(policy.cache.hpc)
    run_decisions(trace, policy, batch=2)
    assert list(policy.cache.hpc) == hpc_before


def test_uncached_layers_fetch_on_demand():
    e = np.full((8, 2, 1), -1)
    e[:4, 0, 0] = [0, 1, 0, 1]  # prompt tokens, encoder layer
    e[4:, 1, 0] = [2, 2, 3, 2]  # generated tokens, decoder layer
    trace = make_trace(e, lengths=[8], prefill=[4], num_experts=4, roles=["encoder", "decoder"])
    policy = policy_for("diffmoe", trace, hpc=1, mpc=1, cached=[1])
    decisions = run_decisions(trace, policy)
    enc = [d for d in decisions if d.layer == 0]
    assert enc and all(src == MISS for d in enc for _, src in d.sources)
    assert not policy.cache.hpc[0] and not policy.cache.mpc[0]


# ------------------------------------------------------------------------------------------------ predictors


def test_noisy_with_perfect_recall_and_precision_is_the_oracle():
    trace = random_trace(np.random.default_rng(4), tokens=40, layers=3, experts=16, k=2)
    oracle = predictor_for("oracle", trace)
    noisy = predictor_for("noisy", trace, {"recall": 1.0, "precision": 1.0})
    rng = np.random.default_rng(0)
    for _ in range(50):
        truth = frozenset(rng.choice(16, size=4, replace=False).tolist())
        assert noisy.predict(0, 1, truth, frozenset()) == oracle.predict(0, 1, truth, frozenset()) == truth


def test_noisy_predictor_reaches_its_recall_and_precision_on_average():
    trace = random_trace(np.random.default_rng(4), tokens=40, layers=3, experts=64, k=2)
    pred = predictor_for("noisy", trace, {"recall": 0.6, "precision": 0.75}, seed=3)
    rng = np.random.default_rng(1)
    tp = n_pred = n_true = 0
    for _ in range(3000):
        truth = frozenset(rng.choice(64, size=8, replace=False).tolist())
        guess = pred.predict(0, 1, truth, frozenset())
        tp += len(guess & truth)
        n_pred += len(guess)
        n_true += len(truth)
    assert tp / n_true == pytest.approx(0.6, abs=0.02)
    assert tp / n_pred == pytest.approx(0.75, abs=0.02)


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("noisy", {"recall": 1.5}, "predictor.params.recall"),
        ("noisy", {"precision": 0}, "predictor.params.precision"),
        ("noisy", {"colour": 1}, "predictor.params.colour"),
    ],
)
def test_bad_predictor_params_name_the_field(name, params, field):
    from moebase.errors import ConfigError

    trace = random_trace(np.random.default_rng(0), tokens=10, layers=2, experts=8, k=2)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        predictor_for(name, trace, params)


def test_bad_policy_params_name_the_field():
    from moebase.errors import ConfigError

    trace = random_trace(np.random.default_rng(0), tokens=10, layers=2, experts=8, k=2)
    with pytest.raises(ConfigError, match=r"policy\.params\.threshold"):
        policy_for("diffmoe", trace, hpc=1, mpc=2, params={"threshold": "high"})
    with pytest.raises(ConfigError, match=r"policy\.params\.speed"):
        policy_for("lru", trace, hpc=1, mpc=2, params={"speed": 3})
