"""`least-stale`: SpecMD's Least-Stale eviction (Hoang, Jaiswal, Samragh, Cho, "SpecMD: A Comprehensive Study On
Speculative Expert Prefetching", arXiv 2602.03921, 2026), on per-layer slots.

What the paper says (abstract and its public summaries; the body of the paper could not be read from here): MoE
expert accesses do not follow the temporal-locality assumptions of LRU and LFU; Least-Stale exploits MoE's
predictable expert access patterns, balancing temporal and spatial locality, and cuts "collision misses" by up to
85x against LRU. The rule itself is therefore **guessed**, from two public re-implementations found by a code search
(not known to be the authors') that agree on it:

- every (layer, expert) keeps its last use and an estimate ``I`` of its reuse interval: the first interval observed
  seeds it, each later one updates it as ``I = 0.75 I + 0.25 interval`` (an exponentially weighted mean);
- an expert's predicted next use is ``last + max(I, 1)`` (an expert with no interval yet: ``last + 1``);
- the victim is the cached expert whose predicted next use is furthest; ties go to the most recent last use, then
  to the higher expert id.

A second reading of the name (in a whole-model cache, an expert whose layer already ran in the current forward
pass is "stale": its next use is a whole pass away) orders experts by layer position; in per-layer slots every
candidate belongs to the same layer and that reading reduces to its tie-break, so it is not what this module does.

Rules this simulator had to choose (**guessed**, the paper being about a whole-model cache and single requests):

- Time is the layer's own step count (one step per iteration in which the layer runs); an interval is the number of
  the layer's steps between two uses. Uses are counted whether the expert was cached or not.
- Per-layer slots, as ``lru``: no pinned experts by default, the layer's ``hpc_slots + mpc_slots`` as one cache
  (hits count as MPC hits); ``pin_hot: true`` pins the layer's hottest ``hpc_slots`` experts in the HPC and the rule
  runs on the ``mpc_slots`` others (``sim.policies.base.PerLayerCache``). The cache starts empty.
- Sets: a layer's active experts in one iteration are used together. First every active expert's last use and
  interval are updated; then each active expert that is not cached (a miss, or a prefetched expert) enters, in id
  order, evicting the victim above among the cached experts the layer does not use now; when every slot holds an
  expert in use now, the newcomer is not admitted. Every newcomer is admitted otherwise (no bypass).
- Prefetching follows the configured predictor (the base class); copies land in their slot (no device-to-device
  promotion).

Shared cache (``cache.organization: shared``): the same per-layer state and step; the victim is the expert of any
cached layer, but those the running layer uses now, whose predicted next use is furthest in whole-model layer steps
(``Policy.global_distance``); ties as above, then the higher layer.
"""

from __future__ import annotations

from sim.policies.base import POLICIES, LayerPlan, PerLayerCache

ORIGIN = "published"

#: Weight of the old estimate in the interval update (the re-implementations' 0.75 / 0.25).
KEEP = 0.75


@POLICIES.register("least-stale")
class LeastStale(PerLayerCache):
    origin = ORIGIN
    supports_shared = True
    admits = "rank"

    def configure(self) -> None:
        super().configure()
        n, e = self.ctx.num_layers, self.ctx.num_experts
        self.step = [0] * n  # the layer's steps so far
        self.last = [[-1] * e for _ in range(n)]  # step of the last use, -1 never used
        self.interval = [[0.0] * e for _ in range(n)]  # the interval estimate, 0 before any interval

    def observe(self, iteration, layer: int, active, plan: LayerPlan) -> None:
        """Advance ``layer``'s step count and update each active expert's interval estimate and last use."""
        self.step[layer] += 1
        now = self.step[layer]
        last, est = self.last[layer], self.interval[layer]
        for e in active:
            prev = last[e]
            if prev >= 0:
                gap = now - prev
                est[e] = float(gap) if est[e] == 0.0 else KEEP * est[e] + (1.0 - KEEP) * gap
            last[e] = now

    def victim_key(self, layer: int, active, newcomers: list[int]):
        """The furthest predicted next use; ties: the most recent last use, then the higher id."""
        last, est = self.last[layer], self.interval[layer]
        return lambda v: (last[v] + max(est[v], 1.0), last[v], v)

    def shared_victim_keys(self, layer: int, active, newcomers: list[int]):
        """The furthest predicted next use in whole-model layer steps (``Policy.global_distance``)."""

        def keys(lay, held):
            t, i, now, distance = self.last[lay], self.interval[lay], self.step[lay], self.global_distance
            return [(distance(t[v] + max(i[v], 1.0) - now, lay, layer), t[v], v) for v in held]

        return keys
