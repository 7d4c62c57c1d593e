"""`lru` (Mixtral-offloading): a per-layer cache with least-recently-used eviction.

Plain by default, as Mixtral-offloading's per-layer LRU: no pinned experts, and the cache holds
``hpc_slots + mpc_slots`` experts per cached layer (the whole configured room; its hits count as MPC hits). The
cache starts empty. With ``pin_hot: true`` the HPC pins the layer's ``hpc_slots`` hottest experts and LRU runs on
the ``mpc_slots`` others (see ``sim.policies.base.PerLayerCache``).

Within one iteration a layer's active experts are used together: hits become most recent first (in id order),
then each missing (or prefetched) expert enters the cache in id order, evicting the least recently used expert
that this layer does not need now; when every slot holds an expert in use now, the newcomer is not admitted.
Prefetching follows the configured predictor (none: no prefetch).
"""

from __future__ import annotations

from sim.cache import LPC, MISS
from sim.policies.base import POLICIES, LayerPlan, PerLayerCache


@POLICIES.register("lru")
class LRU(PerLayerCache):
    def update(self, iteration, layer, active, plan: LayerPlan) -> None:
        if layer not in self.ctx.cached_layers or self.cache.mpc_slots == 0:
            return
        mpc = self.cache.mpc[layer]
        for e in active:
            if e in mpc:
                self.cache.touch(layer, e)
        active_set = set(active)
        for e in active:
            if plan.sources[e] not in (MISS, LPC):
                continue
            victim = None
            if len(mpc) >= self.cache.mpc_slots:
                victim = next((v for v in mpc if v not in active_set), None)
                if victim is None:
                    continue  # every slot holds an expert this layer uses now
            self.cache.promote(layer, e, victim)
            plan.promote[e] = victim
