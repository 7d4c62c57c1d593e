"""`lru` (Mixtral-offloading): a per-layer cache with least-recently-used eviction.

Plain by default, as Mixtral-offloading's per-layer LRU: no pinned experts, and the cache holds
``hpc_slots + mpc_slots`` experts per cached layer (the whole configured room; its hits count as MPC hits). The
cache starts empty. With ``pin_hot: true`` the HPC pins the layer's ``hpc_slots`` hottest experts and LRU runs on
the ``mpc_slots`` others (see ``sim.policies.base.PerLayerCache``).

Within one iteration a layer's active experts are used together: hits become most recent first (in id order),
then each missing (or prefetched) expert enters the cache in id order, evicting the least recently used expert
that this layer does not need now; when every slot holds an expert in use now, the newcomer is not admitted.
Prefetching follows the configured predictor (none: no prefetch).

Shared cache (``cache.organization: shared``): one LRU order over the (layer, expert) pairs of every cached layer;
the same step (hits most recent in active order, then the newcomers in active order), the victim being the least
recently used pair anywhere but the experts the running layer uses now.
"""

from __future__ import annotations

from sim.policies.base import POLICIES, PerLayerCache


@POLICIES.register("lru")
class LRU(PerLayerCache):
    """Evict the least recently used expert, per layer or over the shared cache (the admission driver's default
    ranking)."""

    origin = "published"
    supports_shared = True
    admits = "rank"
    touch_hits = True
