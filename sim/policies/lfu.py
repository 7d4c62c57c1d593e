"""`lfu`: a per-layer cache with least-frequently-used eviction.

Which LFU (``counts``):

- ``perfect`` (default): "perfect LFU". An expert's frequency in a layer is the number of iterations since the run
  started in which it was active in that layer, counted whether it was cached or not: the count survives
  eviction and batches.
- ``in_cache``: "in-cache LFU". Only cached experts have counts: an expert admitted into the cache starts at 1
  (this use), each later iteration in which it is active adds 1, and its count is forgotten when it is evicted
  (or when it is not admitted). A newcomer therefore always has count 1.

Ties are broken by least recent use, then by lower id.

Plain by default: no pinned experts, and the cache holds ``hpc_slots + mpc_slots`` experts per cached layer (the
whole configured room; its hits count as MPC hits). The cache starts empty. With ``pin_hot: true`` the HPC pins
the layer's ``hpc_slots`` hottest experts and LFU runs on the ``mpc_slots`` others (see
``sim.policies.base.PerLayerCache``).

Set semantics as in ``lru``: within one iteration a layer's active experts are used together. First every
active expert's count and last use are updated; then each active expert that is not cached (a miss, or a
prefetched expert) enters the cache, most frequent first (ties: lower id first), evicting the least frequently
used expert this layer does not need now; when every slot holds an expert in use now, the remaining newcomers are
not admitted. Prefetching follows the configured predictor (none: no prefetch).

Shared cache (``cache.organization: shared``): the same counts (per layer and expert) and step, the victim being the
least frequently used (layer, expert) pair of every cached layer but the experts the running layer uses now (ties:
least recent use, a clock over all layers' steps, then lower id).
"""

from __future__ import annotations

from moebase.errors import ConfigError
from sim.config.params import one_of
from sim.core.cache import LPC, MISS
from sim.policies.base import POLICIES, LayerPlan, PerLayerCache

COUNTS = ("perfect", "in_cache")


@POLICIES.register("lfu")
class LFU(PerLayerCache):
    origin = "published"
    supports_shared = True
    admits = "rank"
    PARAMS = {**PerLayerCache.PARAMS, "counts": "perfect"}
    PARAM_RULES = {**PerLayerCache.PARAM_RULES, "counts": one_of(*COUNTS)}

    def configure(self) -> None:
        if self.params["counts"] not in COUNTS:
            raise ConfigError(
                "policy.params.counts", f"must be one of {', '.join(COUNTS)}, got {self.params['counts']!r}"
            )
        super().configure()
        n, e = self.ctx.num_layers, self.ctx.num_experts
        self.freq = [[0] * e for _ in range(n)]  # uses per (layer, expert): see ``counts``
        self.last = [[-1] * e for _ in range(n)]  # the step of the last access (a counter of layer steps)
        self.clock = 0
        self.in_cache = self.params["counts"] == "in_cache"

    def observe(self, iteration, layer: int, active, plan: LayerPlan) -> None:
        """Count this step's uses of ``layer``'s active experts (a newcomer restarts at 1 with ``in_cache``) and
        stamp their last use."""
        self.clock += 1
        freq, last, clock = self.freq[layer], self.last[layer], self.clock
        sources = plan.sources
        for e in active:
            freq[e] = 1 if self.in_cache and sources[e] in (MISS, LPC) else freq[e] + 1
            last[e] = clock

    def victim_key(self, layer: int, active, newcomers: list[int]):
        """Newcomers enter most used first; the victim is the least frequently used (ties: least recent, lower
        id)."""
        freq, last = self.freq[layer], self.last[layer]
        newcomers.sort(key=lambda e: -freq[e])  # stable: ties keep the id order of ``active``
        return lambda v: (-freq[v], -last[v], -v)

    def shared_victim_keys(self, layer: int, active, newcomers: list[int]):
        """As :meth:`victim_key` over the (layer, expert) pairs of every cached layer."""
        freq = self.freq[layer]
        newcomers.sort(key=lambda e: -freq[e])
        freqs, lasts = self.freq, self.last

        def keys(lay, held):
            f, t = freqs[lay], lasts[lay]
            return [(-f[v], -t[v], -v) for v in held]

        return keys

    def after_admission(self, layer: int, newcomers: list[int], plan: LayerPlan) -> None:
        """``in_cache``: an evicted expert's count, and a newcomer's that was not admitted, are forgotten."""
        if not self.in_cache:
            return
        freqs, promote = self.freq, plan.promote
        for victim in promote.values():
            if victim is None:
                continue
            if self.shared:
                freqs[victim[0]][victim[1]] = 0
            else:
                freqs[layer][victim] = 0
        freq = freqs[layer]
        for e in newcomers:
            if e not in promote:
                freq[e] = 0
