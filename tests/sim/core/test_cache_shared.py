"""One expert cache shared by all cached layers (``cache.organization: shared``): the config option and its errors, the
shared tier cache's invariants, each shared policy against a plain restatement of its rule (tests/reference/shared.py,
with lists), Belady's bound in both organizations (random traces, a brute-force optimum, the bundled gpt-oss trace), and
per-layer runs unchanged (invariants through the SimPy engine, as for every policy:
tests/sim/policies/test_policy_properties.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from moebase.files import PROJECT_ROOT
from sim.config.run_config import config_from_dict, load_run_config, memory_check
from sim.core.cache import MISS, MPC, CacheInvariantError, SharedTierCache, TierCache
from sim.core.workload import build_iterations
from sim.decisions.replay import replay
from sim.policies import POLICIES
from sim.policies.belady import belady_bound, belady_bound_shared
from sim.predictors import PREDICTORS, PredictorContext
from sim.run import build_decisions, simulate
from tests.reference.shared import (
    PLAIN,
    until,
)
from tests.support.engine import config_for
from tests.support.policies import BOUNDED, cache_hits
from tests.support.policies import drive as support_drive
from tests.support.policies import policy_for as support_policy_for
from tests.support.traces import make_trace, random_trace
from traces.io import load_trace, save_trace

#: From the registry: the policies that manage a shared cache and keep an MPC in it, the offline bound (belady)
#: included; SHARED: the online ones among them.
SHARED_MPC = tuple(n for n in POLICIES.names() if POLICIES.get(n).supports_shared and POLICIES.get(n).keeps_mpc)
SHARED = tuple(n for n in SHARED_MPC if POLICIES.get(n).origin != "bound")
#: Policies that accept a shared cache but keep nothing in it (those planning with the run's cost model,
#: ``wants_counts``, cannot be built without the engine).
KEEP_NOTHING = tuple(
    n
    for n in POLICIES.names()
    if POLICIES.get(n).supports_shared and not POLICIES.get(n).keeps_mpc and not POLICIES.get(n).wants_counts
)
#: Policies that manage per-layer slots only.
PER_LAYER_ONLY = tuple(n for n in POLICIES.names() if not POLICIES.get(n).supports_shared)


def policy_for(name, trace, its, hpc, mpc, params=None, organization="shared", **context):
    """``tests.support.policies.policy_for`` on a shared cache unless ``organization`` says otherwise."""
    return support_policy_for(name, trace, its, hpc, mpc, params, organization=organization, **context)


def shared_snapshot(cache):
    """The sorted (layer, expert) pairs of the MPC, checking it holds at most its slots."""
    if cache.shared:
        assert cache.mpc_size() <= cache.mpc_slots
    else:
        assert max(len(m) for m in cache.mpc) <= cache.mpc_slots
    return sorted((layer, e) for layer, m in enumerate(cache.mpc) for e in m)


def drive(trace, its, policy, predictor="none", seed=0):
    """Replay; returns the decisions and, per decision, the sorted (layer, expert) pairs of the MPC after it."""
    return support_drive(trace, its, policy, predictor, seed, snapshot=shared_snapshot)


def sequence(trace, its):
    """The run's layer steps in order: (layer, sorted active experts)."""
    out = []
    for it in its:
        for layer in range(trace.num_layers):
            ids = trace.experts[it.rows, layer, :].ravel()
            out.append((layer, sorted({int(x) for x in ids if x >= 0})))
    return out


# ------------------------------------------------------------------------------------------------ config


def tiny_config(tmp_path, **cache):
    trace = random_trace(np.random.default_rng(0), tokens=30, layers=3, experts=8, k=2, requests=3)
    path = save_trace(trace, tmp_path / "t.npz")
    cfg = config_for(path, trace, "lru", hpc=1, mpc=2)
    d = dict(cfg.resolved)
    d["cache"] = {**d["cache"], **cache}
    return d, trace


def test_default_is_per_layer_and_leaves_the_resolved_config_as_before(tmp_path):
    d, _ = tiny_config(tmp_path)
    cfg = config_from_dict(d)
    assert cfg.cache.organization == "per-layer" and cfg.cache.shared_slots is None
    assert "organization" not in cfg.resolved["cache"] and "shared_slots" not in cfg.resolved["cache"]
    shared = config_from_dict({**d, "cache": {**d["cache"], "organization": "shared", "shared_slots": 7}})
    assert shared.resolved["cache"]["organization"] == "shared" and shared.resolved["cache"]["shared_slots"] == 7
    assert config_from_dict(shared.resolved) == shared


@pytest.mark.parametrize(
    "cache, policy, field",
    [
        ({"organization": "global"}, "lru", "cache.organization"),
        ({"organization": 3}, "lru", "cache.organization"),
        ({"shared_slots": 4}, "lru", "cache.shared_slots"),  # per-layer
        ({"organization": "shared", "shared_slots": -1}, "lru", "cache.shared_slots"),
        ({"organization": "shared", "shared_slots": 2.5}, "lru", "cache.shared_slots"),
        ({"organization": "shared", "shared_slots": 25}, "lru", "cache.shared_slots"),  # 3 layers x 8 experts
        ({"organization": "shared"}, "diffmoe", "cache.organization"),
        ({"organization": "shared"}, "diffmoe-arc", "cache.organization"),
    ],
)
def test_bad_values_raise_one_line_naming_the_field(tmp_path, cache, policy, field):
    d, _ = tiny_config(tmp_path, **cache)
    d["policy"] = {"name": policy, "params": {}}
    with pytest.raises(ConfigError) as err:
        config_from_dict(d)
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


def test_a_pinned_hpc_larger_than_the_shared_budget_is_refused(tmp_path):
    d, trace = tiny_config(tmp_path, organization="shared", shared_slots=2)
    d["policy"] = {"name": "lru", "params": {"pin_hot": True}}
    cfg = config_from_dict(d)
    with pytest.raises(ConfigError, match="^cache.shared_slots"):
        build_decisions(cfg, trace)


def test_memory_check_counts_the_shared_budget():
    base = load_run_config("configs/gpt_oss_20b.yaml", ["policy.name=lru", "policy.params={}"])
    eb = base.model.expert_bytes
    per = memory_check(base.model, base.hardware, base.cache, 1, 1000)["tiers"]
    assert per == (2 + 6) * 24 * eb + 16 * eb
    same = load_run_config(
        "configs/gpt_oss_20b.yaml", ["policy.name=lru", "policy.params={}", "cache.organization=shared"]
    )
    assert memory_check(same.model, same.hardware, same.cache, 1, 1000)["tiers"] == per
    more = load_run_config(
        "configs/gpt_oss_20b.yaml",
        ["policy.name=lru", "policy.params={}", "cache.organization=shared", "cache.shared_slots=300"],
    )
    assert memory_check(more.model, more.hardware, more.cache, 1, 1000)["tiers"] == (300 + 16) * eb
    need = memory_check(more.model, more.hardware, more.cache, 1, 1000)
    hw = dataclasses.replace(more.hardware, gpu_memory_bytes=sum(need.values()) + eb)  # room for 301 slots
    memory_check(more.model, hw, dataclasses.replace(more.cache, shared_slots=301), 1, 1000)
    with pytest.raises(ConfigError, match="^cache: .*shared_slots 302 "):
        memory_check(more.model, hw, dataclasses.replace(more.cache, shared_slots=302), 1, 1000)


def test_default_shared_budget_is_the_per_layer_total():
    trace = random_trace(np.random.default_rng(1), tokens=20, layers=3, experts=8, k=2, requests=2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    for name in SHARED_MPC:
        pol = policy_for(name, trace, its, 1, 2)
        assert isinstance(pol.cache, SharedTierCache) and pol.cache.mpc_slots == 9, name
        pinned = policy_for(name, trace, its, 1, 2, {"pin_hot": True})
        assert pinned.cache.hpc_slots == 1 and pinned.cache.mpc_slots == 6, name
        assert policy_for(name, trace, its, 1, 2, shared_slots=5).cache.mpc_slots == 5
    assert "belady" in SHARED_MPC and "belady" not in SHARED and "lru" in SHARED and "on-demand" in KEEP_NOTHING
    for name in KEEP_NOTHING:  # keep nothing, whatever the organization
        assert policy_for(name, trace, its, 1, 2).cache.mpc_slots == 0
    for name in PER_LAYER_ONLY:  # per-layer by design: refused when built, too
        with pytest.raises(ConfigError, match="^cache.organization"):
            policy_for(name, trace, its, 1, 2)


# ------------------------------------------------------------------------------------------- tier cache


def test_shared_tier_cache_invariants():
    c = SharedTierCache(3, 4, 1, 3, {0, 1, 2})
    c.pin_hpc(0, [0])
    for layer, e in [(0, 1), (1, 1), (2, 3)]:
        c.add_lpc(layer, e)
        c.promote(layer, e, None)
    c.check()
    c.add_lpc(1, 2)
    with pytest.raises(CacheInvariantError, match="full"):
        c.promote(1, 2, None)  # capacity is global
    with pytest.raises(CacheInvariantError, match="HPC expert 0 of layer 0"):
        c.promote(1, 2, 0, victim_layer=0)  # the HPC is never evicted
    with pytest.raises(CacheInvariantError, match="not in the MPC"):
        c.promote(1, 2, 3, victim_layer=1)
    c.promote(1, 2, 3, victim_layer=2)  # a victim of another layer
    assert sorted((layer, e) for layer, m in enumerate(c.mpc) for e in m) == [(0, 1), (1, 1), (1, 2)]
    assert c.mpc_size() == 3 and c.counters.evictions == 1
    with pytest.raises(CacheInvariantError, match="over its 3 slots"):
        c.fill_mpc(2, [0])
    c.fill_mpc(1, [])
    c.fill_mpc(2, [0, 1])
    c.check()
    with pytest.raises(CacheInvariantError):
        c.add_lpc(2, 0)  # held: no second copy
    per = TierCache(2, 4, 0, 2, {0, 1})
    per.add_lpc(0, 1)
    with pytest.raises(CacheInvariantError, match="per-layer cache"):
        per.promote(0, 1, 2, victim_layer=1)


# ------------------------------------------------------------------------------- plain restatements (lists)


def check_against_plain(name, trace, its, cap):
    pol = policy_for(name, trace, its, 0, 0, shared_slots=cap)
    decisions, snaps = drive(trace, its, pol)
    want = PLAIN[name](sequence(trace, its), trace.num_layers, cap)
    assert len(want) == len(decisions)
    for d, snap, (src, after) in zip(decisions, snaps, want):
        assert dict(d.sources) == src, (name, d.iteration, d.layer)
        assert snap == after, (name, d.iteration, d.layer)
    return pol


#: A hand-made decode-only trace: 3 layers, top-2, 6 experts, 3 requests.
HAND_MADE = [
    [[0, 1], [2, 3], [4, 5]],
    [[0, 2], [2, 4], [4, 0]],
    [[1, 0], [3, 2], [5, 1]],
    [[5, 3], [2, 5], [0, 1]],
    [[0, 1], [1, 4], [4, 5]],
    [[4, 0], [2, 3], [2, 3]],
    [[1, 5], [0, 3], [4, 5]],
    [[0, 1], [2, 3], [1, 2]],
    [[2, 3], [4, 2], [4, 5]],
    [[0, 5], [3, 1], [0, 5]],
    [[1, 0], [2, 0], [4, 1]],
    [[3, 5], [5, 2], [4, 5]],
]


@pytest.mark.parametrize("name", sorted(PLAIN))
@pytest.mark.parametrize("cap", [1, 3, 5, 8])
@pytest.mark.parametrize("batch", [1, 2])
def test_each_shared_policy_matches_its_plain_restatement_on_a_hand_made_trace(name, cap, batch):
    trace = make_trace(HAND_MADE, lengths=[4, 5, 3], num_experts=6)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    pol = check_against_plain(name, trace, its, cap)
    if cap >= 3:
        assert pol.cache.counters.evictions > 0
    if cap >= 8:
        assert cache_hits(pol) > 0


@pytest.mark.parametrize("name", sorted(PLAIN))
@settings(max_examples=25, **BOUNDED)
@given(
    seed=st.integers(0, 10**6),
    cap=st.integers(1, 9),
    k=st.integers(1, 3),
    batch=st.integers(1, 3),
    layers=st.integers(1, 3),
)
def test_each_shared_policy_matches_its_plain_restatement_on_random_traces(name, seed, cap, k, batch, layers):
    trace = random_trace(np.random.default_rng(seed), tokens=50, layers=layers, experts=7, k=k, requests=3)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    check_against_plain(name, trace, its, cap)


def test_victims_come_from_other_layers_and_lru_evicts_the_layer_that_just_ran():
    """Top-1, 3 layers, 2 slots: a whole-model LRU always evicts the pair used longest ago, i.e. from the layer
    that runs next, so a loop over layers that does not fit never hits (the textbook LRU failure)."""
    trace = make_trace([[[0], [0], [0]]] * 4, num_experts=2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    pol = policy_for("lru", trace, its, 0, 0, shared_slots=2)
    decisions, _ = drive(trace, its, pol)
    assert cache_hits(pol) == 0
    assert [dict(d.promote)[0] for d in decisions[2:5]] == [(0, 0), (1, 0), (2, 0)]
    for name in ("least-stale", "reuse-distance", "learned-rf", "belady"):  # the layer distance keeps two
        pol = policy_for(name, trace, its, 0, 0, shared_slots=2)
        drive(trace, its, pol)
        assert cache_hits(pol) > 0, name


def test_moe_infinity_priority_of_all_layers_at_once_is_each_layers_priority():
    trace = random_trace(np.random.default_rng(4), tokens=60, layers=3, experts=6, k=2, requests=6)
    its, _ = build_iterations(trace, 2, "static", None, True, None)
    for how in ("mix", "eam", "own"):
        pol = policy_for("moe-infinity", trace, its, 0, 0, {"activation": how}, shared_slots=4)
        seen = []

        def after(p):
            seen.append(np.array_equal(p.priority_all(), np.stack([p.priority(j) for j in range(3)])))  # noqa: B023

        replay(trace, its, pol, PREDICTORS.get("none")(None, PredictorContext(3, 6, 0)), after_step=after)
        assert seen and all(seen), how
        assert pol.tracker.collection.size > 0


def test_moe_infinity_shared_victim_is_the_lowest_priority_times_proximity():
    """The EAM priority stubbed by a fixed table: the victim is the pair of lowest ``priority x (1 - d / (L + 1))``
    (``d`` the layers until its layer runs again after the running one: 0 for the next), oldest first on ties; the
    newcomers enter by their own priority, highest first."""
    rng = np.random.default_rng(5)
    trace = random_trace(rng, tokens=40, layers=3, experts=6, k=2, requests=2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    table = np.round(rng.random((3, 6)), 1)  # ties on purpose
    pol = policy_for("moe-infinity", trace, its, 0, 0, shared_slots=5)
    pol.priority_all = lambda: table
    decisions, snaps = drive(trace, its, pol)
    n, cache, since, clock = 3, [], {}, itertools.count()
    for (layer, act), d, snap in zip(sequence(trace, its), decisions, snaps):
        assert dict(d.sources) == {e: (MPC if (layer, e) in cache else MISS) for e in act}
        new = sorted((e for e in act if (layer, e) not in cache), key=lambda e: (-table[layer][e], e))
        for e in new:
            if len(cache) >= 5:
                free = [(lv, v) for lv, v in cache if not (lv == layer and v in act)]
                if not free:
                    break
                prox = {p: 1.0 - (until(p[0], layer, n) - 1) / (n + 1) for p in free}
                victim = min(free, key=lambda p: (table[p[0]][p[1]] * prox[p], since[p]))
                cache.remove(victim)
            cache.append((layer, e))
            since[(layer, e)] = next(clock)
        assert snap == sorted(cache)


def test_uncached_layers_keep_nothing_in_a_shared_cache(tmp_path):
    trace = random_trace(np.random.default_rng(2), tokens=40, layers=3, experts=8, k=2, requests=2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    for name in SHARED_MPC:
        pol = policy_for(name, trace, its, 1, 2, cached={0, 2})
        drive(trace, its, pol)
        assert not pol.cache.mpc[1] and pol.cache.mpc_slots == 6, name
        assert pol.cache.counters.evictions > 0, name


# ------------------------------------------------------------------------------------------- Belady bound


def brute_force_optimum(seq, cap, warm):
    """The most cache hits any demand schedule gets on a cache of ``cap`` (layer, expert) pairs: after each step the
    cache may keep any ``cap`` pairs of (what it held) + (the step's accesses); with ``warm`` it starts with any
    ``cap`` pairs, free. Exhaustive (tiny inputs only)."""
    items = sorted({(layer, e) for layer, act in seq for e in act})
    starts = [frozenset(c) for c in itertools.combinations(items, min(cap, len(items)))] if warm else [frozenset()]
    best = {s: 0 for s in starts}
    for layer, act in seq:
        acc = {(layer, e) for e in act}
        nxt = {}
        for held, score in best.items():
            score += len(held & acc)
            pool = sorted(held | acc)
            for size in range(min(cap, len(pool)) + 1):
                for keep in itertools.combinations(pool, size):
                    keep = frozenset(keep)
                    if nxt.get(keep, -1) < score:
                        nxt[keep] = score
        best = nxt
    return max(best.values())


@settings(max_examples=25, **BOUNDED)
@given(seed=st.integers(0, 10**6), cap=st.integers(1, 3), k=st.integers(1, 2), warm=st.booleans())
def test_shared_belady_is_the_optimum_of_every_demand_schedule(seed, cap, k, warm):
    trace = random_trace(np.random.default_rng(seed), tokens=6, layers=2, experts=3, k=k, requests=1)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    bel = policy_for("belady", trace, its, 0, 0, {"warm": warm}, shared_slots=cap)
    drive(trace, its, bel)
    assert cache_hits(bel) == brute_force_optimum(sequence(trace, its), cap, warm)
    assert belady_bound_shared(trace, its, cap, warm=warm)["hits"] == cache_hits(bel)


@settings(max_examples=25, **BOUNDED)
@given(
    seed=st.integers(0, 10**6),
    per_layer=st.integers(1, 4),
    hpc=st.integers(0, 2),
    batch=st.integers(1, 4),
    k=st.integers(1, 3),
    pin_hot=st.booleans(),
    predictor=st.sampled_from(["none", "oracle", "noisy"]),
)
def test_belady_bounds_every_online_policy_in_both_organizations(seed, per_layer, hpc, batch, k, pin_hot, predictor):
    """At equal total slots (``c`` per layer, ``c x layers`` shared): per-layer Belady >= every per-layer policy;
    shared Belady >= every shared policy, every per-layer one and per-layer Belady."""
    hpc = min(hpc, per_layer)
    trace = random_trace(np.random.default_rng(seed), tokens=50, layers=3, experts=8, k=k, requests=4)
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    n = trace.num_layers
    bel_per = policy_for("belady", trace, its, 0, per_layer, organization="per-layer")
    drive(trace, its, bel_per)
    bel_shared = policy_for("belady", trace, its, 0, per_layer)
    drive(trace, its, bel_shared)
    assert cache_hits(bel_shared) >= cache_hits(bel_per)
    assert belady_bound(trace, its, per_layer)["hits"] == cache_hits(bel_per)
    assert belady_bound_shared(trace, its, per_layer * n)["hits"] == cache_hits(bel_shared)
    for name in SHARED:
        for org in ("per-layer", "shared"):
            pol = policy_for(name, trace, its, hpc, per_layer - hpc, {"pin_hot": pin_hot}, organization=org)
            drive(trace, its, pol, predictor, seed)
            assert cache_hits(bel_shared) >= cache_hits(pol), (name, org)
            if org == "per-layer":
                assert cache_hits(bel_per) >= cache_hits(pol), name


GPT_OSS = PROJECT_ROOT / "traces" / "data" / "gpt_oss_20b.npz"


@pytest.mark.parametrize("batch, requests", [(1, 2), (4, 4)])
def test_belady_bounds_every_online_policy_on_the_gpt_oss_trace(batch, requests):
    """The bundled real routing (gpt-oss-20b: 24 layers, 32 experts, top-4), the first 32 generated tokens of a
    few requests, 2 + 6 slots per layer or 192 shared."""
    trace = load_trace(GPT_OSS)
    its, _ = build_iterations(trace, batch, "static", 32, False, requests)
    bel = {}
    for org in ("per-layer", "shared"):
        bel[org] = policy_for("belady", trace, its, 2, 6, organization=org)
        drive(trace, its, bel[org])
    assert cache_hits(bel["shared"]) >= cache_hits(bel["per-layer"])
    assert belady_bound_shared(trace, its, 8 * 24)["hits"] == cache_hits(bel["shared"])
    for name in SHARED:
        for org in ("per-layer", "shared"):
            pol = policy_for(name, trace, its, 2, 6, organization=org)
            drive(trace, its, pol)
            assert cache_hits(bel[org]) >= cache_hits(pol), (name, org)
            assert cache_hits(bel["shared"]) >= cache_hits(pol), (name, org)


# ------------------------------------------------------------------------------------ per-layer unchanged


def digest(decisions) -> str:
    text = repr(
        [
            (
                d.iteration,
                d.layer,
                tuple(d.active),
                tuple(d.sources),
                tuple(d.promote),
                tuple(d.prefetched),
                tuple(d.unused_prefetch),
            )
            for d in decisions
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Decisions of per-layer runs before the shared organization existed (commit 7b17e7c, the same digest).
BEFORE = {
    ("configs/gpt_oss_20b.yaml", ("workload.requests=2",), "lru", "none"): ("20fc3e48f937c081", 0.6157407407407407),
    ("configs/gpt_oss_20b.yaml", ("workload.requests=4", "workload.batch_size=4"), "lfu", "none"): (
        "5928e4aac37ff302",
        0.5160735939421961,
    ),
    ("configs/gpt_oss_20b.yaml", ("workload.requests=2",), "arc", "oracle"): ("3ec0687578ddac12", 0.9718307461873639),
    ("configs/gpt_oss_20b.yaml", ("workload.requests=2",), "s3fifo", "none"): ("ebe2f23b0112ddd1", 0.6665475217864923),
    ("configs/gpt_oss_20b.yaml", ("workload.requests=2",), "least-stale", "none"): (
        "6df5025158dc8f54",
        0.6241659858387799,
    ),
    ("configs/gpt_oss_20b.yaml", ("workload.requests=4", "workload.batch_size=4"), "reuse-distance", "none"): (
        "8383fcdc34a747c4",
        0.4922140121609715,
    ),
    ("configs/gpt_oss_20b.yaml", ("workload.requests=2",), "learned-rf", "none"): (
        "d1bdc7f274858729",
        0.6686410675381264,
    ),
    ("configs/gpt_oss_20b.yaml", ("workload.requests=2",), "moe-infinity", "moe-infinity"): (
        "f17441681c736e6b",
        0.7559061819172114,
    ),
    ("configs/gpt_oss_20b.yaml", ("workload.requests=4", "workload.batch_size=4"), "belady", "none"): (
        "e89c1dd0c5287ef4",
        0.6695513351769622,
    ),
    ("configs/gpt_oss_20b.yaml", ("workload.requests=2",), "diffmoe", "oracle"): (
        "fb87a83d1d21d378",
        0.9764433551198257,
    ),
    ("configs/mixtral.yaml", ("workload.requests=16", "workload.max_decode_tokens=8"), "lru", "none"): (
        "a278503ea320ff6d",
        0.3286921929388364,
    ),
    ("configs/switch_base_real.yaml", ("workload.requests=8", "workload.max_decode_tokens=8"), "belady", "none"): (
        "90668e54fbad621a",
        0.2719298245614035,
    ),
}


def run_digest(config, sets, policy, predictor):
    overrides = ["policy.params={}", *sets, f"policy.name={policy}", f"predictor.name={predictor}"]
    if policy == "least-stale":
        overrides.append("policy.params.pin_hot=true")
    out = simulate(load_run_config(config, overrides), record_decisions=True)
    return digest(out.engine.decisions), out.summary["hit_rate"]["overall"]


@pytest.mark.parametrize("case", list(BEFORE), ids=lambda c: f"{c[2]}-{c[0].split('/')[-1]}")
def test_per_layer_runs_decide_exactly_as_before(case):
    assert run_digest(*case) == BEFORE[case]
