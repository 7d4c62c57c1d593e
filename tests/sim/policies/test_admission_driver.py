"""The admission driver (``sim.policies.admission``): properties that hold for every registered policy on random traces,
in both cache organizations (the HPC never loses an expert, no victim of a ranked or keeper policy is an expert its
layer uses now, no tier exceeds its slots, the protocol's counters add up to the accesses, by source), no policy
swaps a method on its instance, and a new policy is one class declaring a victim key."""

from __future__ import annotations

from collections import Counter
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.config.run_config import load_run_config
from sim.core.cache import CPU, HPC, LPC, MISS, MPC
from sim.core.workload import build_iterations
from sim.costs.costs import CostModel
from sim.decisions.protocol import DecisionProtocol
from sim.policies import POLICIES, Policy
from sim.policies.admission import KEEPER, MODES, RANK, RULE
from sim.policies.base import PerLayerCache
from tests.support.policies import BOUNDED, policy_context, predictor_for
from tests.support.traces import make_trace, random_trace

#: Every registered policy, from the registry.
NAMES = POLICIES.names()
#: The policies whose published rule evicts an expert the layer uses now (after it computed): belady's MIN over
#: sets, Diff-MoE's slot walk; the driver applies their rules as given.
RULES = tuple(n for n in NAMES if POLICIES.get(n).admits == RULE)


@cache
def costs() -> CostModel:
    """A run's cost model (gpt-oss-20b on the H200): hybrid CPU/GPU policies price copies against the host with it."""
    cfg = load_run_config("configs/gpt_oss_20b.yaml", [])
    return CostModel(cfg.model, cfg.hardware, cfg.system)


@st.composite
def cases(draw):
    """A random workload and cache: trace shape, batch size, tier slots, organization, predictor."""
    experts = draw(st.integers(3, 9))
    hpc = draw(st.integers(0, 2))
    return {
        "seed": draw(st.integers(0, 2**16)),
        "layers": draw(st.integers(1, 3)),
        "experts": experts,
        "k": draw(st.integers(1, min(3, experts))),
        "tokens": draw(st.integers(4, 40)),
        "requests": draw(st.integers(1, 3)),
        "batch": draw(st.integers(1, 3)),
        "hpc": hpc,
        "mpc": draw(st.integers(0, experts - hpc)),
        "shared": draw(st.booleans()),
        "predictor": draw(st.sampled_from(["none", "oracle", "noisy"])),
    }


def build(name: str, case: dict):
    """The policy ``name`` on the case's random trace (a per-layer cache where it manages no shared one), its
    workload and predictor."""
    rng = np.random.default_rng(case["seed"])
    trace = random_trace(rng, case["tokens"], case["layers"], case["experts"], case["k"], case["requests"])
    its, _ = build_iterations(trace, case["batch"], "static", None, True, None)
    shared = case["shared"] and POLICIES.get(name).supports_shared
    ctx = policy_context(
        trace,
        its,
        case["hpc"],
        case["mpc"],
        organization="shared" if shared else "per-layer",
        extra={"costs": costs()},
    )
    params = {"recall": 0.7, "precision": 0.6} if case["predictor"] == "noisy" else None
    return trace, its, POLICIES.get(name)(None, ctx), predictor_for(case["predictor"], trace, params, case["seed"])


class StepChecks:
    """After every layer step: the cache's invariants, the HPC as pinned, the step's victims, and the counters'
    change against the plan's sources."""

    def __init__(self, policy, protocol: DecisionProtocol):
        self.protocol = protocol
        self.hpc = list(policy.cache.hpc)
        self.admits = policy.admits
        self.counts = self.snapshot(policy)
        self.steps = 0

    @staticmethod
    def snapshot(policy) -> Counter:
        c = policy.cache.counters
        return Counter({HPC: c.hits[HPC], MPC: c.hits[MPC], LPC: c.hits[LPC], MISS: c.misses, CPU: c.cpu})

    def __call__(self, policy) -> None:
        cache = policy.cache
        cache.check()  # no tier over its slots (the shared MPC over all layers), no expert held twice
        assert list(cache.hpc) == self.hpc, "an HPC changed after it was pinned"
        d = self.protocol.decisions[-1]
        active = set(d.active)
        for expert, victim in d.promote:
            assert expert in active and expert not in cache.hpc[d.layer]
            if victim is None:
                continue
            vl, v = victim if cache.shared else (d.layer, victim)
            assert v not in cache.hpc[vl], f"HPC expert {v} of layer {vl} evicted"
            if self.admits in (RANK, KEEPER):
                assert not (vl == d.layer and v in active), f"expert {v} evicted while layer {d.layer} uses it"
        now = self.snapshot(policy)
        assert now - self.counts == Counter(src for _, src in d.sources), "counters differ from the plan's sources"
        self.counts = now
        self.steps += 1


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow], **BOUNDED)
@given(case=cases())
def test_every_policy_keeps_the_driver_invariants(name, case):
    trace, its, policy, predictor = build(name, case)
    protocol = DecisionProtocol(trace, policy, predictor, record=True)
    checks = StepChecks(policy, protocol)
    protocol.after_step = checks
    protocol.run(its)
    # hits + misses (+ host experts) = accesses: every (iteration, layer, active expert) counted once
    want = sum(len(d.active) for d in protocol.decisions)
    assert (
        policy.cache.counters.accesses
        == want
        == sum(
            len({int(x) for x in trace.experts[it.rows, layer].ravel() if x >= 0})
            for it in its
            for layer in range(trace.num_layers)
        )
    )
    assert checks.steps == len(protocol.decisions) > 0


def test_only_rules_may_evict_an_active_expert():
    """Belady's MIN and Diff-MoE's artifact walk evict an expert the layer uses now, after it computed; every other
    policy that keeps an MPC admits by a ranking or a keeper, which the driver keeps away from active experts."""
    assert set(RULES) == {"belady", "diffmoe"}
    for name in NAMES:
        cls = POLICIES.get(name)
        assert cls.admits in MODES, name
        assert (cls.admits is None) == (not cls.keeps_mpc), name


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("organization", ["per-layer", "shared"])
def test_no_policy_swaps_a_method_on_its_instance(name, organization):
    """The organization changes what the driver does, not the policy's methods: no instance attribute shadows a
    method of its class (as ``self.update = self.update_shared`` did)."""
    trace = random_trace(np.random.default_rng(0), 30, 2, 6, 2, 2)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    try:
        policy = POLICIES.get(name)(
            None, policy_context(trace, its, 1, 2, organization=organization, extra={"costs": costs()})
        )
    except ConfigError:
        assert organization == "shared" and not POLICIES.get(name).supports_shared
        return
    shadowed = [k for k, v in vars(policy).items() if callable(v) and callable(getattr(type(policy), k, None))]
    assert shadowed == []


class _HighestIdOut(PerLayerCache):
    """Test only: a policy that is one victim key (the highest id goes first), per layer and shared."""

    origin = "ours"
    supports_shared = True

    def victim_key(self, layer, active, newcomers):
        return lambda v: v

    def shared_victim_keys(self, layer, active, newcomers):
        return lambda lay, held: [0] * len(held)  # every key equal: the larger (layer, expert) goes first


@pytest.mark.parametrize("organization", ["per-layer", "shared"])
def test_a_new_policy_is_one_victim_key(organization):
    """Two layers, two slots each (four shared): the driver evicts by the declared key, never an active expert."""
    trace = make_trace([[[0, 1], [0, 1]], [[2, 3], [2, 3]], [[4, 0], [4, 0]]], num_experts=6)
    its, _ = build_iterations(trace, 1, "static", None, True, None)
    policy = _HighestIdOut(None, policy_context(trace, its, 0, 2, organization=organization))
    assert isinstance(policy, Policy) and policy.admits == RANK
    protocol = DecisionProtocol(trace, policy, predictor_for("none", trace), record=True)
    protocol.run(its)
    promotes = [dict(d.promote) for d in protocol.decisions]
    if organization == "per-layer":
        # each layer alone: step 2 evicts 1 then 0 (the highest id first), step 3 evicts 3 then 2
        assert promotes == [{0: None, 1: None}] * 2 + [{2: 1, 3: 0}] * 2 + [{0: 3, 4: 2}] * 2
    else:
        # one cache of 4, equal keys: the largest (layer, expert) not in use by the running layer goes first (an
        # expert of the other layer may go even when that layer uses it, at another step)
        assert promotes == [
            {0: None, 1: None},
            {0: None, 1: None},
            {2: (1, 1), 3: (1, 0)},
            {2: (0, 3), 3: (0, 2)},
            {4: (1, 3)},  # 0 is a hit of layer 0
            {0: (1, 2), 4: (0, 4)},
        ]
    c = policy.cache.counters
    assert c.accesses == 12 and c.hits[MPC] == (0 if organization == "per-layer" else 1)
