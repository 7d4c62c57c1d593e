"""`lookahead`: a per-layer cache that reads the next ``horizon`` iterations of the workload, and nothing further.

What is perfect prediction of the next few tokens' routing worth to a cache? ``lookahead`` answers it: it is the
online rule of ``lru`` made to see ``horizon`` iterations ahead, so the distance from ``lru`` (``horizon: 0``) to
``belady`` (the whole future) shows how much of the gap to the bound a predictor of that reach could close at best
with this rule. No deployed system has it (origin ``bound``); it is this project's yardstick, not a published policy.

Rule, per cached layer, after the gate (the layer's active experts are used together, as in ``lru``):
- hits become most recent, in active order;
- each missing (or prefetched) expert, in active order, enters the cache; a full cache first picks a victim among
  the held experts this layer does not use now: the one whose next use is furthest, a next use more than
  ``horizon`` iterations ahead counting as unknown (furthest of all), and among equals the least recently used;
- bypass: the newcomer is not admitted when its own next use is further than the victim's (both as the horizon
  sees them), or when every slot holds an expert this layer uses now.

With ``horizon: 0`` nothing ahead is seen: every next use is unknown, no newcomer is bypassed, and the decisions are
``lru``'s exactly (tests check it). ``horizon`` counts iterations of the run (at batch 1, tokens). Capacity and
``pin_hot`` are as ``lru``'s (``sim.policies.base.PerLayerCache``). It reads the future from
``ctx.trace`` and ``ctx.iterations`` (``PolicyContext.future``) as ``belady`` does; per-layer slots only.
"""

from __future__ import annotations

from moebase.checks import INT_MAX
from sim.config.params import between
from sim.policies.base import POLICIES, LayerPlan, PerLayerCache
from sim.policies.belady import NEVER, FutureUses, record_next_uses


@POLICIES.register("lookahead")
class Lookahead(PerLayerCache):
    """LRU that sees each held expert's next use up to ``horizon`` iterations ahead."""

    origin = "bound"
    admits = "rank"
    touch_hits = True
    PARAMS = {"pin_hot": False, "horizon": 1}
    PARAM_RULES = {"horizon": between(0, INT_MAX, int)}  # iterations ahead

    def configure(self) -> None:
        super().configure()
        self.horizon = int(self.params["horizon"])
        self.layers = sorted(self.ctx.cached_layers) if self.cache.mpc_slots > 0 else []
        self.future = None
        if self.layers:
            trace, iterations = self.ctx.future("policy lookahead")
            self.future = FutureUses(trace, iterations, self.layers)
        # per layer, each expert's next use as known at its last use (exact for the experts held in the MPC: each
        # entered at a use and has not been used since its last one)
        self.next_use = {layer: [NEVER] * self.ctx.num_experts for layer in self.layers}
        self._nxt: list[int] = []  # the running layer's next uses (``observe``)
        self._last_seen = -1  # the last iteration the horizon sees from the running step

    def observe(self, iteration, layer: int, active, plan: LayerPlan) -> None:
        """Record the next uses of the step's active experts (from the workload's future)."""
        self._nxt = record_next_uses(self.future, self.next_use[layer], iteration, layer, active, "lookahead")
        self._last_seen = iteration + self.horizon

    def seen(self, expert: int) -> int:
        """The running layer's expert's next use as the horizon sees it (NEVER: unknown)."""
        u = self._nxt[expert]
        return u if u <= self._last_seen else NEVER

    def victim_key(self, layer: int, active, newcomers: list[int]):
        """The furthest next use as the horizon sees it; among equals the least recently used (the first in MPC
        order)."""
        return self.seen

    def keeps_out(self, layer: int, expert: int, victim) -> bool:
        """Bypass: the newcomer is needed later than its victim (both as the horizon sees them)."""
        return self.seen(expert) > self.seen(victim)
