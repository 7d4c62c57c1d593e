"""The cached-expert slot total (``sim.config.memory.expert_slots``) is computed in one place: the config's memory
check (``CacheConfig.total_slots``) and a policy's shared cache (``PolicyContext.shared_total``) agree on every
cache a config can hold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sim.config.memory import expert_slots
from sim.config.run_config import CacheConfig
from sim.policies.base import PolicyContext


@given(
    hpc=st.integers(0, 16),
    mpc=st.integers(0, 16),
    layers=st.integers(1, 12),
    shared=st.one_of(st.none(), st.integers(0, 400)),
    organization=st.sampled_from(["per-layer", "shared"]),
)
def test_the_config_and_the_policy_context_count_the_same_slots(hpc, mpc, layers, shared, organization):
    shared = shared if organization == "shared" else None  # a config holds shared_slots only with a shared cache
    cache = CacheConfig(hpc, mpc, 4, 1, "all", organization=organization, shared_slots=shared)
    ctx = PolicyContext(
        num_layers=layers + 1,
        num_experts=32,
        layer_roles=("decoder",) * (layers + 1),
        cached_layers=frozenset(range(layers)),
        hpc_slots=hpc,
        mpc_slots=mpc,
        hot_ranking=(),
        organization=organization,
        shared_slots=shared,
    )
    want = shared if shared is not None else (hpc + mpc) * layers
    assert cache.total_slots(layers) == ctx.shared_total() == expert_slots(hpc, mpc, layers, shared) == want


def test_a_per_layer_cache_ignores_a_stray_shared_size():
    """``CacheConfig.total_slots`` reads ``shared_slots`` only for a shared cache (as before the total moved)."""
    assert CacheConfig(2, 3, 4, 1, "all", organization="per-layer", shared_slots=7).total_slots(5) == 25
    assert CacheConfig(2, 3, 4, 1, "all", organization="shared", shared_slots=7).total_slots(5) == 7
