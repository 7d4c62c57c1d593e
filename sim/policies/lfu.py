"""`lfu`: a per-layer cache of ``mpc_slots`` experts with least-frequently-used eviction.

An expert's frequency in a layer is the number of iterations since the run started in which it was active in
that layer, counted whether it was cached or not (perfect LFU: the count survives eviction and batches). Ties
are broken by least recent use, then by lower id.

Optionally (``pin_hot``, default true) the HPC pins the layer's ``hpc_slots`` hottest experts, as in ``lru``
(``hpc_slots: 0`` for plain LFU). Set semantics as in ``lru``: within one iteration a layer's active experts
are used together. First every active expert's count and last use are updated; then each active expert that
is not cached (a miss, or a prefetched expert) enters the MPC, most frequent first (ties: router's order),
evicting the least frequently used expert this layer does not need now; when every slot holds an expert in
use now, the remaining newcomers are not admitted. Prefetching follows the configured predictor (none: no
prefetch).
"""

from __future__ import annotations

from sim.cache import LPC, MISS
from sim.policies.base import POLICIES, LayerPlan, PerLayerCache


@POLICIES.register("lfu")
class LFU(PerLayerCache):
    def configure(self) -> None:
        super().configure()
        n, e = self.ctx.num_layers, self.ctx.num_experts
        self.freq = [[0] * e for _ in range(n)]       # accesses per (layer, expert) since the run started
        self.last = [[-1] * e for _ in range(n)]      # the step of the last access (a counter of layer steps)
        self.clock = 0

    def update(self, iteration, layer, active, plan: LayerPlan) -> None:
        if layer not in self.ctx.cached_layers or self.cache.mpc_slots == 0:
            return
        self.clock += 1
        freq, last, clock = self.freq[layer], self.last[layer], self.clock
        for e in active:
            freq[e] += 1
            last[e] = clock
        cache = self.cache
        mpc, slots = cache.mpc[layer], cache.mpc_slots
        sources = plan.sources
        newcomers = [e for e in active if sources[e] in (MISS, LPC)]
        if not newcomers:
            return
        newcomers.sort(key=lambda e: -freq[e])  # stable: ties keep the router's order
        active_set = set(active)
        for e in newcomers:
            victim = None
            if len(mpc) >= slots:
                held = [v for v in mpc if v not in active_set]
                if not held:
                    break  # every slot holds an expert this layer uses now
                victim = min(held, key=lambda v: (freq[v], last[v], v))
            cache.promote(layer, e, victim)
            plan.promote[e] = victim
