"""Policies and predictors (plain Python, no engine): checked against independent re-statements of their rules,
and tier invariants under random traces and sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.cache import HPC, LPC, MISS, MPC
from sim.core.replay import replay
from sim.core.workload import build_iterations
from sim.policies import POLICIES, PolicyContext
from sim.policies.base import hot_ranking_from_counts, selection_counts
from sim.predictors import PREDICTORS, PredictorContext
from tests.conftest import make_trace, plain_lru, random_trace
from traces.analysis import stats


def make_policy(name, trace, hpc=0, mpc=2, params=None, ranking=None, cached=None):
    ranking = ranking or hot_ranking_from_counts(selection_counts(trace.experts, trace.num_experts))
    ctx = PolicyContext(
        trace.num_layers,
        trace.num_experts,
        tuple(x.role for x in trace.meta.model.layers),
        frozenset(range(trace.num_layers)) if cached is None else frozenset(cached),
        hpc,
        mpc,
        tuple(tuple(r) for r in ranking),
        0,
        {"trace": trace},
    )
    return POLICIES.get(name)(params, ctx)


def make_predictor(name, trace, params=None, seed=0):
    return PREDICTORS.get(name)(params, PredictorContext(trace.num_layers, trace.num_experts, seed))


def run_decisions(trace, policy, predictor="none", batch=1, check=True, pred_params=None):
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    pred = make_predictor(predictor, trace, pred_params)
    return replay(trace, its, policy, pred, after_step=(lambda p: p.cache.check()) if check else None)


# ------------------------------------------------------------------------------------------------------ LRU


def plain_lru_hits(trace, capacity):
    """Per layer, one token at a time, through the plain LRU re-statement."""
    return sum(
        plain_lru(
            [(t, sorted({int(x) for x in trace.experts[t, layer] if x >= 0})) for t in range(trace.num_tokens)],
            capacity,
        )
        for layer in range(trace.num_layers)
    )


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), capacity=st.integers(1, 7), k=st.integers(1, 3))
def test_lru_matches_a_plain_list_lru_at_batch_1(seed, capacity, k):
    trace = random_trace(np.random.default_rng(seed), tokens=60, layers=2, experts=8, k=k, requests=2)
    policy = make_policy("lru", trace, hpc=0, mpc=capacity)
    run_decisions(trace, policy)
    c = policy.cache.counters
    assert c.hits[MPC] == plain_lru_hits(trace, capacity)
    assert c.hits[HPC] == 0 and c.hits[LPC] == 0
    assert c.accesses == int((trace.experts >= 0).sum())


def test_lru_top1_hit_rate_equals_the_stack_distance_figure_of_traces_stats():
    rng = np.random.default_rng(5)
    trace = random_trace(rng, tokens=400, layers=3, experts=12, k=1, requests=4)
    for cap in (1, 3, 6):
        policy = make_policy("lru", trace, hpc=0, mpc=cap)
        run_decisions(trace, policy)
        want, _ = stats.lru_hit_rates(stats.reuse_profile(trace), [cap])
        assert policy.cache.counters.hits[MPC] / policy.cache.counters.accesses == pytest.approx(want[cap])


# -------------------------------------------------------------------------------------------------- Diff-MoE

#: The earlier rules of this simulator's ``diffmoe``, before the artifact's (scores floored at 0, victims weakest
#: first among the MPC experts not active now with ties longest-held first, Python floats): kept as params. The
#: default is the artifact's rules, checked hit for hit against fetcher.cc in tests/test_diffmoe_artifact.py.
LEGACY = {"floor": True, "victim_order": "legacy", "arithmetic": "float64"}


def plain_diffmoe(trace, hpc, mpc, ranking, max_val=2.0, dec_in=0.4, dec_out=0.2, threshold=1.0):
    """DESIGN 2.2 as this simulator read it before following the artifact (see ``LEGACY``), written out directly, for a
    decode-only trace at batch 1 (one static batch).
    Returns per (token, layer): ({expert: source}, sorted MPC contents after the step)."""
    steps = []
    state = {}
    for layer in range(trace.num_layers):
        hot = list(ranking[layer])
        score = {e: 0.0 for e in range(trace.num_experts)}
        for e in hot[: hpc + mpc]:
            score[e] = max_val
        state[layer] = (set(hot[:hpc]), list(hot[hpc : hpc + mpc]), score)
    for t in range(trace.num_tokens):
        for layer in range(trace.num_layers):
            hpc_set, mpc_list, score = state[layer]
            active = sorted({int(x) for x in trace.experts[t, layer] if x >= 0})
            src = {e: (HPC if e in hpc_set else MPC if e in mpc_list else MISS) for e in active}
            for e in active:
                score[e] = min(score[e] + 1, max_val)
            for e in score:
                if e not in active:
                    cached = e in hpc_set or e in mpc_list
                    score[e] = max(score[e] - (dec_in if cached else dec_out), 0.0)
            cands = sorted(active, key=lambda e: (-score[e], e))
            slots = sorted([e for e in mpc_list if e not in active], key=lambda e: score[e])
            i = 0
            for c in cands:
                if i >= len(slots) or score[slots[i]] >= threshold or score[c] < threshold:
                    break
                if c in hpc_set or c in mpc_list:
                    continue
                mpc_list.remove(slots[i])  # ``mpc_list`` is in order of entry: ties among victims go to the
                mpc_list.append(c)  # longest held
                i += 1
            steps.append((src, sorted(mpc_list)))
    return steps


HAND_MADE = [
    [[0, 1]],
    [[2, 3]],
    [[2, 4]],
    [[2, 4]],
    [[5, 1]],
    [[3, 4]],
    [[3, 4]],
    [[0, 5]],
    [[5, 3]],
    [[1, 2]],
    [[4, 5]],
    [[4, 5]],
    [[4, 0]],
    [[3, 2]],
]


def legacy_vs_plain(trace, hpc, mpc):
    ranking = [tuple(range(trace.num_experts))] * trace.num_layers
    policy = make_policy("diffmoe", trace, hpc=hpc, mpc=mpc, ranking=ranking, params=LEGACY)
    snapshots = []  # MPC of every layer after each (token, layer) step
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    decisions = replay(
        trace,
        its,
        policy,
        make_predictor("none", trace),
        after_step=lambda p: snapshots.append([sorted(m) for m in p.cache.mpc]),
    )
    mpc_after = [snap[d.layer] for snap, d in zip(snapshots, decisions)]
    want = plain_diffmoe(trace, hpc, mpc, ranking)
    assert [dict(d.sources) for d in decisions] == [w[0] for w in want]
    assert mpc_after == [w[1] for w in want]
    return policy


@pytest.mark.parametrize("experts", [HAND_MADE, "random"])
def test_diffmoe_legacy_params_reproduce_the_earlier_rules(experts):
    if experts == "random":
        trace = random_trace(np.random.default_rng(11), tokens=120, layers=2, experts=10, k=2, requests=1)
    else:
        trace = make_trace(HAND_MADE, num_experts=6)
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
    new = make_policy("diffmoe", trace, hpc=1, mpc=2, ranking=ranking)
    old = make_policy("diffmoe", trace, hpc=1, mpc=2, ranking=ranking, params=LEGACY)
    run_decisions(trace, new)
    run_decisions(trace, old)
    assert new.cache.counters.promotions < old.cache.counters.promotions


def test_diffmoe_start_of_batch_state_and_hpc_never_change():
    trace = random_trace(np.random.default_rng(2), tokens=200, layers=2, experts=16, k=2, requests=4)
    policy = make_policy("diffmoe", trace, hpc=3, mpc=4)
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
    policy = make_policy("diffmoe", trace, hpc=1, mpc=1, cached=[1])
    decisions = run_decisions(trace, policy)
    enc = [d for d in decisions if d.layer == 0]
    assert enc and all(src == MISS for d in enc for _, src in d.sources)
    assert not policy.cache.hpc[0] and not policy.cache.mpc[0]


# --------------------------------------------------------------------------------------- every policy, invariants


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    policy=st.sampled_from(["lru", "diffmoe", "on-demand", "gpu-only"]),
    hpc=st.integers(0, 3),
    mpc=st.integers(0, 4),
    batch=st.integers(1, 4),
    predictor=st.sampled_from(["none", "oracle", "noisy"]),
)
def test_tier_invariants_hold_for_every_policy(seed, policy, hpc, mpc, batch, predictor):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, tokens=50, layers=3, experts=8, k=2, requests=4)
    pol = make_policy(policy, trace, hpc=hpc, mpc=mpc)
    hpc_sets = None

    def check(p):
        nonlocal hpc_sets
        p.cache.check()  # capacities, no expert in two slots
        if hpc_sets is None:
            hpc_sets = list(p.cache.hpc)
        assert list(p.cache.hpc) == hpc_sets  # high-priority experts are never evicted
        for layer in range(trace.num_layers):
            assert len(p.cache.mpc[layer]) <= p.cache.mpc_slots

    its, _ = build_iterations(trace, batch, "static", None, True, None)
    decisions = replay(
        trace,
        its,
        pol,
        make_predictor(predictor, trace, {"recall": 0.7, "precision": 0.6} if predictor == "noisy" else None, seed),
        after_step=check,
    )
    c = pol.cache.counters
    assert c.accesses == sum(len(d.active) for d in decisions)  # hits + misses = accesses
    assert c.misses == sum(1 for d in decisions for _, s in d.sources if s == MISS)
    if policy == "gpu-only":
        assert c.misses == 0 and c.hits[HPC] == c.accesses
    if policy == "on-demand":
        assert c.accesses == c.misses + c.hits[LPC]


# ------------------------------------------------------------------------------------------------ predictors


def test_noisy_with_perfect_recall_and_precision_is_the_oracle():
    trace = random_trace(np.random.default_rng(4), tokens=40, layers=3, experts=16, k=2)
    oracle = make_predictor("oracle", trace)
    noisy = make_predictor("noisy", trace, {"recall": 1.0, "precision": 1.0})
    rng = np.random.default_rng(0)
    for _ in range(50):
        truth = frozenset(rng.choice(16, size=4, replace=False).tolist())
        assert noisy.predict(0, 1, truth, frozenset()) == oracle.predict(0, 1, truth, frozenset()) == truth


def test_noisy_predictor_reaches_its_recall_and_precision_on_average():
    trace = random_trace(np.random.default_rng(4), tokens=40, layers=3, experts=64, k=2)
    pred = make_predictor("noisy", trace, {"recall": 0.6, "precision": 0.75}, seed=3)
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
    from sim.errors import ConfigError

    trace = random_trace(np.random.default_rng(0), tokens=10, layers=2, experts=8, k=2)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        make_predictor(name, trace, params)


def test_bad_policy_params_name_the_field():
    from sim.errors import ConfigError

    trace = random_trace(np.random.default_rng(0), tokens=10, layers=2, experts=8, k=2)
    with pytest.raises(ConfigError, match=r"policy\.params\.threshold"):
        make_policy("diffmoe", trace, 1, 2, params={"threshold": "high"})
    with pytest.raises(ConfigError, match=r"policy\.params\.speed"):
        make_policy("lru", trace, 1, 2, params={"speed": 3})
