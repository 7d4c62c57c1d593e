"""The baseline policies (sim/policies/pregated.py, prefetch_all.py, lfu.py, belady.py) against plain re-statements of
their rules, the optimality of belady (against an exact search and against the online policies), belady_bound (the tiers
every policy keeps and Belady's bound over the online policies: tests/sim/policies/test_policy_properties.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.cache import HPC, LPC, MISS, MPC
from sim.core.workload import build_iterations
from sim.decisions.replay import replay
from sim.policies.belady import belady_bound
from tests.reference.belady import plain_min
from tests.reference.lfu import plain_lfu_pinned
from tests.reference.lru import plain_lru
from tests.support.policies import cache_hits, policy_for, predictor_for
from tests.support.traces import enc_dec_trace, make_trace, random_trace

# ----------------------------------------------------------------------------------------------------- helpers


def workload(trace, batch=1, batching="static"):
    its, _ = build_iterations(trace, batch, batching, None, True, None)
    return its


def run(trace, its, policy, predictor="none", pred_params=None, check=True, after=None):
    def step(p):
        if check:
            p.cache.check()
        if after is not None:
            after(p)

    return replay(trace, its, policy, predictor_for(predictor, trace, pred_params), after_step=step)


def layer_steps(trace, its):
    """Per layer: [(batch began, set of active experts)] for every iteration that runs the layer, read straight off
    the trace (encoder layers run in prefill iterations, decoder layers in decode ones; all layers in both for a
    decoder-only model)."""
    roles = [x.role for x in trace.meta.model.layers]
    enc_dec = "encoder" in roles and "decoder" in roles
    out = {layer: [] for layer in range(len(roles))}
    pending = [False] * len(roles)  # a batch began and the layer has not run since
    for it in its:
        for layer, role in enumerate(roles):
            pending[layer] = pending[layer] or it.new_batch
            if enc_dec and role != ("encoder" if it.kind == "prefill" else "decoder"):
                continue
            act = {int(x) for r in it.rows for x in trace.experts[r, layer] if x >= 0}
            out[layer].append((pending[layer], act))
            pending[layer] = False
    return out


# ---------------------------------------------------------------------------------- plain re-statements (lists)


def exact_optimum(steps, cap, n_exp, warm=True):
    """The most cache hits any demand policy can get on one layer's steps: an exhaustive search over cache
    states. After a step the cache may hold any ``cap`` experts of (cache + the step's experts); ``warm``: at each
    batch start it may hold any ``cap`` experts (the free start-of-batch fill)."""
    states_all = [frozenset(c) for r in range(cap + 1) for c in itertools.combinations(range(n_exp), r)]
    states = {frozenset(): 0}
    for new_batch, act in steps:
        if warm and new_batch:
            best = max(states.values())
            states = {s: best for s in states_all}
        nxt = {}
        for c, h in states.items():
            h += len(act & c)
            pool = sorted(c | act)
            for r in range(min(cap, len(pool)) + 1):
                for keep in itertools.combinations(pool, r):
                    keep = frozenset(keep)
                    if nxt.get(keep, -1) < h:
                        nxt[keep] = h
        states = nxt
    return max(states.values())


# ----------------------------------------------------------------------------------------- LRU and belady exactly


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), cap=st.integers(1, 6), k=st.integers(1, 3), warm=st.booleans())
def test_lru_and_belady_match_plain_list_implementations_at_batch_1(seed, cap, k, warm):
    trace = random_trace(np.random.default_rng(seed), tokens=50, layers=2, experts=8, k=k, requests=3)
    its = workload(trace, 1)
    steps = layer_steps(trace, its)
    lru = policy_for("lru", trace, its, hpc=0, mpc=cap)
    run(trace, its, lru)
    assert cache_hits(lru) == sum(plain_lru(s, cap) for s in steps.values())
    bel = policy_for("belady", trace, its, hpc=0, mpc=cap, params={"warm": warm})
    run(trace, its, bel)
    assert cache_hits(bel) == sum(plain_min(s, cap, warm) for s in steps.values())
    assert bel.cache.counters.accesses == int((trace.experts >= 0).sum())


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 10**6), cap=st.integers(1, 3), batch=st.integers(1, 3), k=st.integers(1, 3), warm=st.booleans()
)
def test_belady_is_the_exact_optimum_for_sets_of_any_batch(seed, cap, batch, k, warm):
    """belady's hits equal an exhaustive search's over every demand policy (new cache entries come from the step's
    active experts; any of them may be evicted after the step), for top-k and batch > 1 alike."""
    trace = random_trace(np.random.default_rng(seed), tokens=14, layers=1, experts=5, k=k, requests=3)
    its = workload(trace, batch)
    bel = policy_for("belady", trace, its, hpc=0, mpc=cap, params={"warm": warm})
    run(trace, its, bel)
    steps = layer_steps(trace, its)[0]
    assert cache_hits(bel) == exact_optimum(steps, cap, 5, warm)


def test_never_evicting_an_active_expert_is_not_optimal_for_sets():
    """Why belady may evict an expert the step uses: the textbook rule that never does (lru's victim rule) is
    forced to keep an active expert it will not need soon, and loses hits to the optimum (6 instead of 8 here)."""
    sets = [{1, 2}, {1}, {0, 3}, {1, 2, 3}, {0, 1, 3}, {0, 3}, {1, 2, 3}]
    trace = make_trace([[sorted(s) + [-1] * (3 - len(s))] for s in sets], num_experts=4)
    its = workload(trace, 1)
    steps = layer_steps(trace, its)[0]
    assert plain_min(steps, 2, warm=False, evict_active=False) == 6
    bel = policy_for("belady", trace, its, hpc=0, mpc=2, params={"warm": False})
    run(trace, its, bel)
    assert cache_hits(bel) == exact_optimum(steps, 2, 4, warm=False) == 8


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    cap=st.integers(0, 5),
    batch=st.integers(1, 4),
    warm=st.booleans(),
    enc_dec=st.booleans(),
    cached=st.sampled_from(["all", "some"]),
    pinned_slots=st.integers(0, 2),
)
def test_belady_bound_equals_the_belady_policy(seed, cap, batch, warm, enc_dec, cached, pinned_slots):
    rng = np.random.default_rng(seed)
    trace = enc_dec_trace(rng) if enc_dec else random_trace(rng, tokens=40, layers=3, experts=6, k=2, requests=4)
    its = workload(trace, batch)
    layers = None if cached == "all" else [0, trace.num_layers - 1]
    bound = belady_bound(trace, its, cap, layers, warm=warm)
    # without pin_hot the configured HPC slots join the MIN slots, so any split of ``cap`` gives the same cache
    h = min(pinned_slots, cap)
    bel = policy_for("belady", trace, its, hpc=h, mpc=cap - h, params={"warm": warm}, cached=layers)
    run(trace, its, bel)
    c = bel.cache.counters
    assert bound["hits"] == cache_hits(bel) == c.hits[MPC]
    assert bound["accesses"] == c.accesses
    assert bound["hit_rate"] == pytest.approx(c.hits[MPC] / c.accesses)


def test_belady_bound_on_a_hand_made_trace():
    # one layer, top-1, batch 1: a b a c a b, cold, 1 slot: MIN keeps a (used again soonest) -> hits at a, a
    trace = make_trace([[[0]], [[1]], [[0]], [[2]], [[0]], [[1]]], num_experts=3)
    its = workload(trace, 1)
    assert belady_bound(trace, its, 1, warm=False) == {"hits": 2, "accesses": 6, "hit_rate": pytest.approx(1 / 3)}
    assert belady_bound(trace, its, 2, warm=False)["hits"] == 3  # a and b kept
    assert belady_bound(trace, its, 1, warm=True)["hits"] == 3  # a filled before the first step
    assert belady_bound(trace, its, 0)["hits"] == 0


def test_belady_needs_the_workload():
    from moebase.errors import ConfigError

    trace = random_trace(np.random.default_rng(0), tokens=10, layers=2, experts=4, k=1)
    with pytest.raises(ConfigError, match="iterations"):
        policy_for("belady", trace, None)


# ------------------------------------------------------------------------------------------------------------ LFU


@pytest.mark.parametrize(
    "batch, hpc, mpc, pin_hot",
    [
        (1, 0, 1, False),
        (1, 0, 3, False),
        (1, 2, 2, True),
        (3, 1, 3, True),
        (4, 0, 5, False),
        (1, 2, 2, False),
        (3, 1, 3, False),
    ],
)
def test_lfu_matches_a_plain_restatement(batch, hpc, mpc, pin_hot):
    """With ``pin_hot`` the HPC pins the hottest ``hpc`` experts and LFU runs on ``mpc`` slots; without (the
    default) LFU runs on all ``hpc + mpc`` slots."""
    trace = random_trace(np.random.default_rng(batch * 10 + mpc), tokens=120, layers=2, experts=10, k=2, requests=6)
    its = workload(trace, batch)
    ranking = [tuple(range(trace.num_experts))[::-1]] * trace.num_layers
    pol = policy_for("lfu", trace, its, hpc=hpc, mpc=mpc, ranking=ranking, params={"pin_hot": pin_hot})
    snapshots = []
    decisions = run(trace, its, pol, after=lambda p: snapshots.append([sorted(m) for m in p.cache.mpc]))
    steps = layer_steps(trace, its)
    pinned, cap = (hpc, mpc) if pin_hot else (0, hpc + mpc)
    want = {layer: iter(plain_lfu_pinned(s, set(ranking[layer][:pinned]), cap)) for layer, s in steps.items()}
    for d, snap in zip(decisions, snapshots):
        src, mpc_after = next(want[d.layer])
        assert dict(d.sources) == src
        assert snap[d.layer] == mpc_after
    assert pol.cache.counters.hits[MPC] > 0 and pol.cache.counters.evictions > 0


# ------------------------------------------------------------------------------------------ pregated, prefetch-all


@pytest.mark.parametrize("batch, enc_dec", [(1, False), (3, False), (2, True)])
def test_pregated_with_an_oracle_misses_only_in_each_iterations_first_layer(batch, enc_dec):
    rng = np.random.default_rng(batch)
    trace = (
        enc_dec_trace(rng, tokens=60, experts=8)
        if enc_dec
        else random_trace(rng, tokens=60, layers=3, experts=8, k=2, requests=4)
    )
    its = workload(trace, batch)
    pol = policy_for("pregated", trace, its, hpc=2, mpc=3)  # the configured slots are ignored: nothing kept
    decisions = run(trace, its, pol, "oracle")
    first = set()
    seen = set()
    for d in decisions:
        if d.iteration not in seen:
            seen.add(d.iteration)
            first.add((d.iteration, d.layer))
    for d in decisions:
        want = MISS if (d.iteration, d.layer) in first else LPC
        assert all(src == want for _, src in d.sources), d
        assert not d.unused_prefetch and not d.promote
    c = pol.cache.counters
    assert c.hits[HPC] == c.hits[MPC] == 0
    assert c.misses == sum(len(d.active) for d in decisions if (d.iteration, d.layer) in first) > 0
    assert c.hits[LPC] > 0


def test_pregated_with_a_noisy_pregate_misses_what_it_did_not_prefetch():
    trace = random_trace(np.random.default_rng(3), tokens=60, layers=3, experts=8, k=2, requests=4)
    its = workload(trace, 2)
    pol = policy_for("pregated", trace, its)
    decisions = run(trace, its, pol, "noisy", {"recall": 0.6, "precision": 0.5})
    fetched = {}
    for d in decisions:
        got = fetched.pop((d.iteration, d.layer), ())
        assert {e for e, s in d.sources if s == LPC} == set(d.active) & set(got)
        assert set(d.unused_prefetch) == set(got) - set(d.active)
        nxt = [x for x in decisions if x.iteration == d.iteration and x.layer > d.layer][:1]
        if nxt:
            fetched[(d.iteration, nxt[0].layer)] = d.prefetched
    assert pol.cache.counters.misses > 0 and pol.cache.counters.hits[LPC] > 0


@pytest.mark.parametrize("predictor", ["none", "noisy"])
def test_prefetch_all_copies_every_expert_of_the_next_layer(predictor):
    trace = random_trace(np.random.default_rng(7), tokens=50, layers=3, experts=6, k=2, requests=3)
    its = workload(trace, 2)
    pol = policy_for("prefetch-all", trace, its, hpc=1, mpc=2)
    decisions = run(trace, its, pol, predictor, {"recall": 0.5, "precision": 0.5} if predictor == "noisy" else None)
    by_it = {}
    for d in decisions:
        by_it.setdefault(d.iteration, []).append(d)
    for ds in by_it.values():
        for pos, d in enumerate(ds):
            assert d.prefetched == (tuple(range(6)) if pos + 1 < len(ds) else ())
            want = MISS if pos == 0 else LPC
            assert all(src == want for _, src in d.sources)
            if pos:
                assert set(d.unused_prefetch) == set(range(6)) - set(d.active)
    c = pol.cache.counters
    assert c.hits[HPC] == c.hits[MPC] == 0 and not any(pol.cache.mpc) and not any(pol.cache.hpc)


def test_prefetch_all_skips_experts_already_cached_or_in_flight():
    from sim.policies.prefetch_all import PrefetchAll

    trace = random_trace(np.random.default_rng(0), tokens=10, layers=2, experts=6, k=1)
    pol = policy_for("prefetch-all", trace, workload(trace))
    pol.cache.mpc_slots = 2  # a subclass could keep experts: those are not copied again
    pol.cache.mpc[1] = {3: None}
    pol.cache.add_lpc(1, 4)
    assert PrefetchAll.plan_prefetch(pol, 0, 1, frozenset()) == [0, 1, 2, 5]
