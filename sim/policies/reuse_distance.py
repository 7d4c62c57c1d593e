"""`reuse-distance`: evict the cached expert whose next reuse is predicted furthest away, each expert's prediction
made from its own past reuse intervals in the layer; online (it never reads the future).

In the spirit of CECAR's reuse-distance prediction for expert caches. CECAR's text could not be found from here
(no paper, code or description of it was reachable), so beyond the one-line summary it is known by ("predict each
cached expert's next reuse distance from its own past reuse intervals in the layer, evict the one predicted
furthest") every rule below is **guessed**:

- Time is the layer's own step count (one step per iteration in which the layer runs). Every use of an expert in the
  layer, cached or not, closes an interval (steps since its previous use); the expert keeps its last ``window``
  intervals (param, default 8).
- Prediction, at the current step, for an expert last used ``age`` steps ago with past intervals ``h``: the mean
  residual ``mean(t - age for t in h if t > age)`` of the intervals longer than ``age`` (the expected wait, given
  that it has not come back yet). When none is longer (the expert is overdue), the prediction is ``age`` itself
  (it has been away that long, so expect as long again): a long-gone expert's prediction grows with its absence,
  so it is evicted eventually. An expert with no interval of its own yet (used once) is predicted from the layer's
  last ``4 window`` intervals of all experts instead.
- Victim: the largest prediction among the cached experts the layer does not use now; ties go to the least recent
  use, then to the lower id.

Tiers and sets as ``lru`` (``sim.policies.base.PerLayerCache``): no pinned experts by default, the layer's
``hpc_slots + mpc_slots`` as one cache (hits count as MPC hits); ``pin_hot: true`` pins the layer's hottest
``hpc_slots`` experts and the rule runs on the ``mpc_slots`` others. The cache starts empty. A layer's active
experts in one iteration are used together: all their intervals are recorded first, then each newcomer (a miss or a
prefetched expert) enters in id order, evicting the victim above; when every slot holds an expert in use now the
newcomer is not admitted (otherwise every newcomer is admitted: no bypass). Copies land in their slot.

Shared cache (``cache.organization: shared``): the same per-layer state and step; the victim is the expert of any
cached layer, but those the running layer uses now, whose predicted next use is furthest in whole-model layer steps
(``Policy.global_distance``); ties as above, then the higher layer.
"""

from __future__ import annotations

from collections import deque

from sim.config.params import between
from sim.policies.base import POLICIES, LayerPlan, PerLayerCache

ORIGIN = "published"


def predicted_distance(history, age: int) -> float:
    """Expected steps until the next use of an expert last used ``age`` steps ago whose past intervals are
    ``history`` (non-empty): the mean residual of the longer intervals, or ``age`` when none is longer."""
    longer = [t - age for t in history if t > age]
    return sum(longer) / len(longer) if longer else float(age)


@POLICIES.register("reuse-distance")
class ReuseDistance(PerLayerCache):
    origin = ORIGIN
    supports_shared = True
    admits = "rank"
    PARAMS = {**PerLayerCache.PARAMS, "window": 8}
    PARAM_RULES = {**PerLayerCache.PARAM_RULES, "window": between(1, 1 << 12, kind=int)}

    def configure(self) -> None:
        super().configure()
        n, e, w = self.ctx.num_layers, self.ctx.num_experts, self.params["window"]
        self.step = [0] * n
        self.last = [[-1] * e for _ in range(n)]
        self.history: list[list[deque[int]]] = [[deque(maxlen=w) for _ in range(e)] for _ in range(n)]
        # the layer's recent intervals, every expert
        self.pooled: list[deque[int]] = [deque(maxlen=4 * w) for _ in range(n)]

    def observe(self, iteration, layer: int, active, plan: LayerPlan) -> None:
        """Advance ``layer``'s step count and record each active expert's reuse interval (its own history and the
        layer's pool) and last use."""
        self.step[layer] += 1
        now = self.step[layer]
        last, hist, pooled = self.last[layer], self.history[layer], self.pooled[layer]
        for e in active:
            if last[e] >= 0:
                gap = now - last[e]
                hist[e].append(gap)
                pooled.append(gap)
            last[e] = now

    def prediction(self, layer: int, expert: int) -> float:
        """The predicted steps until ``expert``'s next use in ``layer`` (it has been used before)."""
        age = self.step[layer] - self.last[layer][expert]
        own = self.history[layer][expert]
        pool = own if own else self.pooled[layer]
        return predicted_distance(pool, age) if pool else float(age)

    def victim_key(self, layer: int, active, newcomers: list[int]):
        """The largest predicted distance; ties: the least recent use, then the lower id."""
        last, pred = self.last[layer], self.prediction
        return lambda v: (pred(layer, v), -last[v], -v)

    def shared_victim_keys(self, layer: int, active, newcomers: list[int]):
        """The furthest predicted next use in whole-model layer steps (``Policy.global_distance``)."""
        pred = self.prediction

        def keys(lay, held):
            t, distance = self.last[lay], self.global_distance
            return [(distance(pred(lay, v), lay, layer), -t[v], -v) for v in held]

        return keys
