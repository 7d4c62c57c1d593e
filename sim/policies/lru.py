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

from sim.core.cache import LPC, MISS, MPC
from sim.policies.base import POLICIES, LayerPlan, PerLayerCache


@POLICIES.register("lru")
class LRU(PerLayerCache):
    origin = "published"
    supports_shared = True

    def configure(self) -> None:
        super().configure()
        if self.shared:
            self.order: dict[tuple[int, int], None] = {}  # (layer, expert) in the shared MPC, least recent first
            self.update = self.update_shared

    def update_shared(self, iteration, layer, active, plan: LayerPlan) -> None:
        cache = self.cache
        if layer not in self.ctx.cached_layers or cache.mpc_slots == 0:
            return
        order, sources = self.order, plan.sources
        newcomers = []
        for e in active:
            src = sources[e]
            if src == MPC:
                key = (layer, e)
                del order[key]
                order[key] = None
            elif src == MISS or src == LPC:
                newcomers.append(e)
        if not newcomers:
            return
        active_set = set(active)
        slots, promote = cache.mpc_slots, plan.promote
        for e in newcomers:
            victim = None
            if cache.mpc_size() >= slots:
                for victim in order:  # the least recently used pair the running layer does not need now
                    if victim[0] != layer or victim[1] not in active_set:
                        break
                else:
                    break  # every slot holds an expert this layer uses now
                del order[victim]
                cache.promote(layer, e, victim[1], victim[0])
            else:
                cache.promote(layer, e, None)
            order[(layer, e)] = None
            promote[e] = victim

    def update(self, iteration, layer, active, plan: LayerPlan) -> None:
        cache = self.cache
        if layer not in self.ctx.cached_layers or cache.mpc_slots == 0:
            return
        mpc, sources = cache.mpc[layer], plan.sources
        resident = plan.resident if plan.resident is not None else active
        for e in resident:  # hits become most recent, in active order (the tiers are as classify left them)
            if sources[e] == MPC:
                del mpc[e]
                mpc[e] = None
        if plan.copied is not None:
            newcomers = [e for e, _ in plan.copied]  # misses and prefetched experts, in active order
        else:
            newcomers = [e for e in active if sources[e] == MISS or sources[e] == LPC]
        if not newcomers:
            return
        active_set = set(active)
        slots, promote = cache.mpc_slots, plan.promote
        for e in newcomers:
            victim = None
            if len(mpc) >= slots:
                for victim in mpc:  # the least recently used expert this layer does not need now
                    if victim not in active_set:
                        break
                else:
                    continue  # every slot holds an expert this layer uses now
            cache.promote(layer, e, victim)
            promote[e] = victim
