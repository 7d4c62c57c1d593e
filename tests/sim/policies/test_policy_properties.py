"""What every registered policy keeps (sim/policies/base.py: what a policy answers and declares), one test per
property parametrized over ``sim.config.registries.POLICIES``: the tiers after every step, Belady's bound at equal
slots, and the engine's invariants, each on random tiny traces (hypothesis) with the policy's own params drawn too.

A policy a property does not hold for is skipped with the reason; the policy-specific rules (each against a plain
restatement) stay in the policy's own test file."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config.registries import POLICIES
from sim.config.run_config import config_from_dict
from sim.core.cache import CPU, HPC, LPC, MISS, MPC, SharedTierCache
from sim.core.workload import build_iterations
from sim.decisions.replay import replay
from sim.policies.base import KeepNothing
from sim.run import simulate
from tests.support.engine import config_for
from tests.support.policies import NOISY, cache_hits, policy_for, predictor_for
from tests.support.traces import enc_dec_trace, random_trace
from traces.io import save_trace

NAMES = POLICIES.names()

#: Policies that split experts between the host CPU and the GPU by each layer's token counts: they plan with the
#: run's cost model, so they are driven through the engine only (here and in tests/sim/timing/test_hybrid.py).
COST_PLANNED = {n for n in NAMES if POLICIES.get(n).wants_counts}

#: Each policy's params drawn with the trace (the others run with their defaults). ``train`` (next-use-odds):
#: trained, and so warm-started, on another random trace of the same shape.
PARAMS = {
    "arc": {"pin_hot": st.booleans()},
    "belady": {"pin_hot": st.booleans(), "warm": st.booleans()},
    "learned-rf": {"pin_hot": st.booleans()},
    "least-stale": {"pin_hot": st.booleans()},
    "lfu": {"pin_hot": st.booleans(), "counts": st.sampled_from(["perfect", "in_cache"])},
    "lookahead": {"pin_hot": st.booleans(), "horizon": st.integers(0, 20)},
    "lru": {"pin_hot": st.booleans()},
    "moe-infinity": {
        "pin_hot": st.booleans(),
        "activation": st.sampled_from(["mix", "eam", "own"]),
        "capacity": st.integers(1, 3),
    },
    "next-use-odds": {"train": st.booleans()},
    "reuse-distance": {"pin_hot": st.booleans()},
    "s3fifo": {"pin_hot": st.booleans()},
}

#: Predictors drawn for every policy; a policy's own (``default_predictor``) joins them where it is another.
PREDICTORS = ["none", "oracle", "noisy"]


#: Policies that may evict an expert the layer uses now (after it computed), with the reason.
MAY_EVICT_IN_USE = {
    "belady": "the offline optimum evicts an expert once it computed when its next use is farthest",
    "diffmoe": "the artifact's threshold walk replaces an active expert whose score fell below the threshold",
}


#: Policies that prefetch without a predictor's guesses, with the reason.
PREFETCH_UNGUESSED = {"prefetch-all": "copies every expert of the next layer"}


def slots_hold(pol, hpc: int, mpc: int) -> None:
    """A policy with ``pin_hot`` pins ``hpc`` experts of each cached layer only when asked, its MPC taking the HPC's
    slots otherwise."""
    if "pin_hot" in pol.params:
        pinned = pol.params["pin_hot"]
        assert pol.cache.mpc_slots == mpc + (0 if pinned else hpc)
        assert pol.cache.hpc_slots == (hpc if pinned else 0)
        want = min(hpc, pol.ctx.num_experts) if pinned else 0
        assert [len(s) for s in pol.cache.hpc] == [want if i in pol.ctx.cached_layers else 0
                                                   for i in range(pol.ctx.num_layers)]  # fmt: skip


def drawn_params(name: str):
    return st.fixed_dictionaries(PARAMS.get(name, {}))


def predictors_of(name: str):
    own = POLICIES.get(name).default_predictor
    return st.sampled_from(PREDICTORS + ([own] if own and own not in PREDICTORS else []))


def made_params(params: dict, trace, folder, seed: int) -> dict:
    """``params`` as the policy reads them: ``train: True`` becomes a training trace of ``trace``'s shape saved in
    ``folder``, ``train: False`` no training."""
    params = dict(params)
    if params.pop("train", False):
        train = random_trace(np.random.default_rng(seed + 1), tokens=60, layers=trace.num_layers,
                             experts=trace.num_experts, k=trace.top_k, requests=3)  # fmt: skip
        params["train"] = str(save_trace(train, folder / f"train{seed}.npz"))
    return params


def predictor_params(predictor: str, params: dict):
    if predictor == "noisy":
        return NOISY
    if predictor == "cross-layer" and "train" in params:
        return {"train": params["train"]}
    return None


def per_policy(names, skip: dict[str, str]):
    """``names`` as pytest params, those in ``skip`` marked skipped with their reason."""
    return [pytest.param(n, marks=pytest.mark.skip(reason=skip[n])) if n in skip else n for n in names]


# ------------------------------------------------------------------------------------ tiers, without the engine


@pytest.mark.parametrize(
    "policy",
    per_policy(NAMES, {n: "plans with the run's cost model: checked through the engine below" for n in COST_PLANNED}),
)
@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), seed=st.integers(0, 10**6), hpc=st.integers(0, 3), mpc=st.integers(0, 4),
       batch=st.integers(1, 4), batching=st.sampled_from(["static", "continuous"]), enc_dec=st.booleans(),
       cached=st.sampled_from(["all", "decoder"]))  # fmt: skip
def test_the_tiers_hold_after_every_step(tmp_path, policy, data, seed, hpc, mpc, batch, batching, enc_dec, cached):
    """Capacities are never exceeded and no expert holds two slots (``cache.check``), the HPC is never evicted,
    working buffers hold at most the next layer's prefetches, hits + misses (+ host experts) =
    accesses, uncached layers are served only by copies (or the host), a promotion admits only an expert copied now
    and never evicts one the layer uses; ``pin_hot`` decides whether the HPC's slots are pinned or the MPC's; a policy
    that keeps no MPC hits none there, one that caches nothing hits only its copies, nothing is prefetched without a
    predictor's guesses, and with every expert resident every access is an HPC hit."""
    rng = np.random.default_rng(seed)
    trace = enc_dec_trace(rng, tokens=40, experts=8) if enc_dec else random_trace(rng, 50, 3, 8, 2, 4)
    its, _ = build_iterations(trace, batch, batching, None, True, None)
    roles = [x.role for x in trace.meta.model.layers]
    layers = None if cached == "all" else [i for i, r in enumerate(roles) if r == "decoder"]
    params = made_params(data.draw(drawn_params(policy)), trace, tmp_path, seed)
    predictor = data.draw(predictors_of(policy))
    pol = policy_for(policy, trace, its, hpc, mpc, params, cached=layers)
    cls = POLICIES.get(policy)
    hpc_sets = list(pol.cache.hpc)

    def check(p):
        p.cache.check()
        assert list(p.cache.hpc) == hpc_sets  # high-priority experts are never evicted
        assert all(len(m) <= p.cache.mpc_slots for m in p.cache.mpc)
        assert len({layer for layer, _ in p.cache.lpc}) <= 1  # a layer's buffers are dropped when it finishes

    pred = predictor_for(predictor, trace, predictor_params(predictor, params), seed)
    decisions = replay(trace, its, pol, pred, after_step=check)
    c = pol.cache.counters
    assert c.accesses == sum(len(d.active) for d in decisions) == c.misses + sum(c.hits.values()) + c.cpu
    assert c.misses == sum(1 for d in decisions for _, s in d.sources if s == MISS)
    uncached = set(range(trace.num_layers)) - set(pol.ctx.cached_layers)
    assert all(s in (MISS, LPC, CPU) for d in decisions if d.layer in uncached for _, s in d.sources)
    for d in decisions:
        sources = dict(d.sources)
        for e, victim in d.promote:
            assert sources[e] in (MISS, LPC), d  # only newcomers are admitted
            if policy not in MAY_EVICT_IN_USE:  # never evicts an expert the layer uses now
                assert victim is None or victim not in d.active, d
    slots_hold(pol, hpc, mpc)
    if not cls.keeps_mpc:
        assert c.hits[MPC] == 0
    if issubclass(cls, KeepNothing):  # caches nothing: every expert comes from a copy
        assert c.hits[HPC] == c.hits[MPC] == 0 and c.accesses == c.misses + c.hits[LPC]
    if (predictor == "none" or not cls.uses_predictor) and policy not in PREFETCH_UNGUESSED:
        assert not any(d.prefetched for d in decisions) and c.hits[LPC] == 0
    if cls.all_resident:
        assert c.misses == 0 and c.hits[HPC] == c.accesses


# ------------------------------------------------------------------------------------------------ Belady bound

#: Where Belady's bound (the most cache hits any demand policy gets at the same slots) does not apply.
NOT_BOUNDED = {
    "belady": "the bound itself",
    "gpu-only": "every expert resident: more than any cache of the same slots holds",
    **{n: "computes experts on the host: its hits are not a cache's of the same slots" for n in COST_PLANNED},
}


@pytest.mark.parametrize("policy", per_policy(NAMES, NOT_BOUNDED))
@settings(max_examples=50, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), seed=st.integers(0, 10**6), total=st.integers(1, 5), hpc=st.integers(0, 3),
       batch=st.integers(1, 4), k=st.integers(1, 3), batching=st.sampled_from(["static", "continuous"]))  # fmt: skip
def test_belady_hits_at_least_as_often_at_equal_slots(tmp_path, policy, data, seed, total, hpc, batch, k, batching):
    """Online: hpc + mpc = total per layer; belady: all of it MIN. Belady is the optimum over demand policies with a
    free fill at batch starts (tests/sim/policies/test_baselines.py checks it against an exact search), which every
    policy here is: it admits only experts active in the step (missed or prefetched alike, so prefetching does not
    change what it caches), and its only other entries are the free HPC pin and a start-of-batch fill."""
    hpc = min(hpc, total)
    trace = random_trace(np.random.default_rng(seed), tokens=60, layers=2, experts=10, k=k, requests=4)
    its, _ = build_iterations(trace, batch, batching, None, True, None)
    bel = policy_for("belady", trace, its, 0, total)
    replay(trace, its, bel, predictor_for("none", trace))
    params = made_params(data.draw(drawn_params(policy)), trace, tmp_path, seed)
    predictor = data.draw(predictors_of(policy))
    pol = policy_for(policy, trace, its, hpc, total - hpc, params)
    replay(trace, its, pol, predictor_for(predictor, trace, predictor_params(predictor, params), seed))
    assert cache_hits(bel) >= cache_hits(pol)


# -------------------------------------------------------------------------------------------- through the engine


@pytest.mark.parametrize("policy", NAMES)
@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), seed=st.integers(0, 10**6), batch=st.integers(1, 4), hpc=st.integers(0, 2),
       mpc=st.integers(0, 3), k=st.integers(1, 3), buffers=st.integers(1, 5),
       batching=st.sampled_from(["static", "continuous"]))  # fmt: skip
def test_the_engine_keeps_the_invariants(tmp_path, policy, data, seed, batch, hpc, mpc, k, buffers, batching):
    """Through the SimPy engine (tiers checked after every layer): every access is a hit, a miss or a host
    expert, the working buffers in use never exceed their number, no layer's MPC exceeds its slots, a promotion
    admits only an expert copied now and never evicts one the layer uses, and an MPC of no slots hits nothing."""
    trace = random_trace(np.random.default_rng(seed), tokens=48, layers=3, experts=8, k=k, requests=4)
    path = save_trace(trace, tmp_path / f"t{seed}.npz")
    params = made_params(data.draw(drawn_params(policy)), trace, tmp_path, seed)
    predictor = data.draw(predictors_of(policy))
    cfg = config_for(path, trace, policy, predictor, batch, hpc, mpc, buffers, batching, seed=seed,
                     policy_params=params, predictor_params=predictor_params(predictor, params))  # fmt: skip
    out = simulate(cfg, trace=trace, check_invariants=True, record_decisions=True)
    s, decisions, cache = out.summary, out.engine.decisions, out.policy.cache
    hits = s["hits"]
    assert hits["hpc"] + hits["mpc"] + hits["lpc"] + s["misses"] + s["cpu_experts"] == s["accesses"]
    assert s["accesses"] == sum(len(d.active) for d in decisions)
    assert s["max_buffers_in_use"] <= buffers
    assert max(len(m) for m in cache.mpc) <= cache.mpc_slots  # capacity never exceeded
    for d in decisions:
        sources = dict(d.sources)
        for e, victim in d.promote:
            assert sources[e] in (MISS, LPC), d
            if policy not in MAY_EVICT_IN_USE:
                assert victim is None or victim not in d.active, d
    slots_hold(out.policy, hpc, mpc)
    if cache.mpc_slots == 0:
        assert hits["mpc"] == 0


#: Policies that manage one cache shared by all cached layers and keep an MPC in it.
SHARED_MPC = [n for n in NAMES if POLICIES.get(n).supports_shared and POLICIES.get(n).keeps_mpc]
NOT_SHARED = {n: "keeps no shared MPC (per-layer slots only, or no MPC)" for n in NAMES if n not in SHARED_MPC}


@pytest.mark.parametrize(
    "policy",
    per_policy(
        NAMES, {n: "keeps no shared MPC (per-layer slots only, or no MPC)" for n in NAMES if n not in SHARED_MPC}
    ),
)
@settings(max_examples=20, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), seed=st.integers(0, 10**6), batch=st.integers(1, 4), hpc=st.integers(0, 2),
       mpc=st.integers(0, 3), extra=st.integers(-2, 4), k=st.integers(1, 3), buffers=st.integers(1, 5),
       batching=st.sampled_from(["static", "continuous"]))  # fmt: skip
def test_the_engine_keeps_the_invariants_in_a_shared_cache(
    tmp_path, policy, data, seed, batch, hpc, mpc, extra, k, buffers, batching
):
    """``cache.organization: shared`` (``extra`` slots more or fewer than the per-layer total, or that total):
    every access is a hit or a miss, the shared MPC never exceeds its slots (the pinned HPC's taken out), a
    promotion admits only an expert copied now and never evicts a pinned one, nor one the layer uses now."""
    trace = random_trace(np.random.default_rng(seed), tokens=40, layers=3, experts=8, k=k, requests=4)
    path = save_trace(trace, tmp_path / f"t{seed}.npz")
    params = made_params(data.draw(drawn_params(policy)), trace, tmp_path, seed)
    predictor = data.draw(predictors_of(policy))
    pinned = params.get("pin_hot", False)
    slots = max(0, (hpc + mpc) * 3 + extra) if extra else None
    if pinned and slots is not None:
        slots = max(slots, hpc * 3)
    cfg = config_for(path, trace, policy, predictor, batch, hpc, mpc, buffers, batching, seed=seed,
                     policy_params=params, predictor_params=predictor_params(predictor, params))  # fmt: skip
    d = dict(cfg.resolved)
    d["cache"] = {**d["cache"], "organization": "shared", "shared_slots": slots}
    out = simulate(config_from_dict(d), trace=trace, check_invariants=True, record_decisions=True)
    s, decisions, cache = out.summary, out.engine.decisions, out.policy.cache
    hits = s["hits"]
    assert hits["hpc"] + hits["mpc"] + hits["lpc"] + s["misses"] == s["accesses"]
    assert s["accesses"] == sum(len(d.active) for d in decisions)
    assert isinstance(cache, SharedTierCache)
    total = (hpc + mpc) * 3 if slots is None else slots
    assert cache.mpc_slots == total - (hpc * 3 if pinned else 0)
    assert cache.mpc_size() <= cache.mpc_slots  # capacity never exceeded (checked after every layer too)
    hpc_sets = list(cache.hpc)
    for dec in decisions:
        sources = dict(dec.sources)
        for e, victim in dec.promote:
            assert sources[e] in (MISS, LPC)  # only newcomers are admitted
            if victim is None:
                continue
            layer, v = victim
            assert v not in hpc_sets[layer]  # the HPC is never evicted
            if policy not in MAY_EVICT_IN_USE:
                assert not (layer == dec.layer and v in dec.active), dec
    if cache.mpc_slots == 0:
        assert hits["mpc"] == 0
