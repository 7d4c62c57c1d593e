"""`lru` (Mixtral-offloading): a per-layer cache of ``mpc_slots`` experts with least-recently-used eviction.

Optionally the HPC pins the layer's ``hpc_slots`` hottest experts (``hpc_slots: 0`` for plain LRU). Within one
iteration a layer's active experts are used together: hits become most recent first, then each missing (or
prefetched) expert enters the cache in the router's order, evicting the least recently used expert that this
layer does not need now. Prefetching follows the configured predictor (none: no prefetch).
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
