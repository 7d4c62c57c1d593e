"""The one-pass plan (``AdmissionDriver._plan_ranked``) against the general plan (``Policy.classify`` then the
driver's ``step``): over random cache states and steps, every policy that takes the one-pass plan gives the same
plan (sources, promotions, unused prefetches, the split lists) and leaves the same cache (tiers in order, working
buffers, counters), and the one-pass plan keeps the tiers' invariants it does not check as it goes.

The policies: every registered one whose driver takes the one-pass plan (a per-layer ranking that observes nothing
and classifies as the base class does: ``lru``, plain and with ``pin_hot``), and test rankings that reach the plan's
other branches (a victim key, a bypass, an after-admission hook, no touched hits).

Both plans count the prefetches used (``LayerPlan.prefetch_hits``) as the protocol would count them from ``copied``,
and their unused prefetches (one set difference) are the held ones not active, sorted;
the base ``plan_prefetch`` (one set difference, its working buffers taken in one update) picks the prefetches that
filtering its sorted guess picks and leaves the cache as ``TierCache.add_lpc`` of each prefetch does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.core.cache import LPC
from sim.policies import POLICIES, PolicyContext
from sim.policies.admission import AdmissionDriver
from sim.policies.base import PerLayerCache, Policy
from sim.policies.lru import LRU
from tests.support.fuzz import fuzz_settings


class KeyedLRU(LRU):
    """A victim key: the highest id not in use goes first."""

    def victim_key(self, layer, active, newcomers):
        return lambda v: v


class BypassLRU(LRU):
    """Keeps an odd newcomer out rather than evict an even victim."""

    def keeps_out(self, layer, expert, victim):
        return expert % 2 == 1 and victim % 2 == 0


class AfterLRU(LRU):
    """Records what each ranked step admitted (``after_admission``)."""

    def configure(self):
        super().configure()
        self.admitted: list = []

    def after_admission(self, layer, newcomers, plan):
        self.admitted.append((layer, tuple(newcomers), tuple(plan.promote.items())))


class Untouched(PerLayerCache):
    """A ranking whose hits do not become most recent (first in, first out)."""

    name = "fifo-test"


#: Every registered policy, and the test rankings, by a name.
CANDIDATES = {
    **{name: POLICIES.get(name) for name in POLICIES.names()},
    "keyed": KeyedLRU,
    "bypass": BypassLRU,
    "after": AfterLRU,
    "untouched": Untouched,
}


def context(layers: int, experts: int, hpc: int, mpc: int, cached: frozenset[int]) -> PolicyContext:
    ranking = tuple(tuple(range(experts)) for _ in range(layers))
    return PolicyContext(layers, experts, ("decoder",) * layers, cached, hpc, mpc, ranking)


def one_pass(name: str, params: dict | None, ctx: PolicyContext):
    """The policy ``name`` with ``params`` when its driver takes the one-pass plan, else None."""
    policy = CANDIDATES[name](params, ctx)
    fused = getattr(policy.driver.plan, "__func__", None) is AdmissionDriver._plan_ranked
    return policy if fused else None


def plans_otherwise(cls) -> bool:
    """A policy class that never takes the one-pass plan: it admits otherwise, observes its steps, classifies
    or plans its layers itself."""
    own = [getattr(cls, n) is not getattr(Policy, n) for n in ("observe", "classify", "plan_layer")]
    return cls.admits != "rank" or any(own)


def test_the_one_pass_plan_serves_lru_and_the_test_rankings_only():
    ctx = context(2, 6, 1, 2, frozenset({0, 1}))
    takers = set()
    for name, cls in CANDIDATES.items():
        try:
            if one_pass(name, None, ctx) is not None:
                takers.add(name)
        except (ConfigError, ValueError):  # it needs a workload, a trace or a cost model: it plans otherwise
            assert plans_otherwise(cls), name
    assert takers == {"lru", "keyed", "bypass", "after", "untouched"}
    assert all(plans_otherwise(POLICIES.get(name)) for name in POLICIES.names() if name != "lru")


def state(policy) -> tuple:
    cache = policy.cache
    c = cache.counters
    return (
        [sorted(h) for h in cache.hpc],
        [list(m) for m in cache.mpc],  # in order: the recency the next step evicts by
        [sorted(x) for x in cache.lpc_of],
        (c.insertions, c.evictions, c.promotions),
        getattr(policy, "admitted", None),
    )


def plan_prefetch_by_add_lpc(policy, layer: int, predicted) -> list[int]:
    """``Policy.plan_prefetch`` as it was written: the sorted guess filtered, each prefetch entering its working
    buffer by ``add_lpc``."""
    if not predicted:
        return []
    cache = policy.cache
    hpc, mpc, lpc = cache.hpc[layer], cache.mpc[layer], cache.lpc_of[layer]
    out = [e for e in sorted(predicted) if e not in hpc and e not in mpc and e not in lpc]
    for e in out:
        cache.add_lpc(layer, e)
    return out


def plan_of(plan) -> tuple:
    return (
        list(plan.sources.items()),
        list(plan.promote.items()),
        plan.unused_prefetch,
        plan.resident,
        plan.copied,
        plan.cpu,
    )


@st.composite
def runs(draw):
    layers = draw(st.integers(1, 3))
    experts = draw(st.integers(2, 8))
    hpc = draw(st.integers(0, 2))
    mpc = draw(st.integers(0, experts - hpc))
    cached = frozenset(i for i, on in enumerate(draw(st.lists(st.booleans(), min_size=layers, max_size=layers))) if on)
    subsets = st.lists(st.booleans(), min_size=experts, max_size=experts).map(
        lambda mask: {e for e, on in enumerate(mask) if on}
    )
    steps = draw(
        st.lists(
            st.tuples(st.integers(0, layers - 1), subsets.filter(bool), subsets),  # (layer, active, predicted)
            min_size=1,
            max_size=25,
        )
    )
    return layers, experts, hpc, mpc, cached, steps


@fuzz_settings(max_examples=60)
@given(
    run=runs(),
    name=st.sampled_from(["lru", "keyed", "bypass", "after", "untouched"]),
    pin_hot=st.booleans(),
)
def test_the_one_pass_plan_is_the_general_plan(run, name, pin_hot):
    layers, experts, hpc, mpc, cached, steps = run
    ctx = context(layers, experts, hpc, mpc, cached)
    params = {"pin_hot": pin_hot}
    fused, general = one_pass(name, params, ctx), one_pass(name, params, ctx)
    assert fused is not None and general is not None
    general_plan = general.driver._plan_general
    for index, (layer, active, predicted) in enumerate(steps):
        active = sorted(active)  # as the protocol hands a layer's active experts
        # the gate of the layer before predicted some of this layer's experts: their copies are in working buffers
        assert fused.plan_prefetch(index, layer, frozenset(predicted)) == plan_prefetch_by_add_lpc(
            general, layer, frozenset(predicted)
        )
        assert state(fused) == state(general)
        held = set(fused.cache.lpc_of[layer])  # the prefetches in working buffers as the layer starts
        a, b = fused.driver.plan(index, layer, active), general_plan(index, layer, active)
        assert plan_of(a) == plan_of(b)
        assert a.prefetch_hits == b.prefetch_hits == sum(1 for _, src in a.copied if src == LPC)
        assert a.unused_prefetch == sorted(e for e in held if e not in a.sources)  # as the plans wrote it before
        assert state(fused) == state(general)
        fused.cache.check()  # the one-pass plan skips the promotions' own checks: the tiers still hold
        fused.finish_layer(index, layer)
        general.finish_layer(index, layer)
