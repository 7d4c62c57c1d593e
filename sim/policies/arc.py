"""`arc`: plain ARC, the Adaptive Replacement Cache (Megiddo and Modha, "ARC: A Self-Tuning, Low Overhead
Replacement Cache", FAST 2003), one per cached layer: a general-purpose anchor.

ARC as published (the paper's Fig. 4), on the ``c`` slots of a layer: the cache is a recency list T1 (experts seen
once since they entered) and a frequency list T2 (seen at least twice), with ghost lists B1 and B2 (ids only) of
recent evictions from each, and a target size ``p`` (a real number, 0 <= p <= c) for T1. On a request for x:

- x in T1 or T2 (hit): x moves to the most recent end of T2.
- x in B1: ``p = min(c, p + d)`` with ``d = 1`` if ``|B1| >= |B2|`` else ``|B2| / |B1|``; REPLACE; x enters T2.
- x in B2: ``p = max(0, p - d)`` with ``d = 1`` if ``|B2| >= |B1|`` else ``|B1| / |B2|``; REPLACE; x enters T2.
- otherwise, if ``|T1| + |B1| = c``: if ``|T1| < c``, the oldest of B1 is dropped and REPLACE runs; else the
  oldest of T1 is evicted (not remembered). If ``|T1| + |B1| < c`` and the four lists hold ``>= c`` ids: if they
  hold ``2c``, the oldest of B2 is dropped; REPLACE runs. x enters T1.
- REPLACE: if ``|T1| >= 1`` and (``|T1| > p``, or x is in B2 and ``|T1| = p``), the oldest of T1 is evicted into B1;
  else the oldest of T2 is evicted into B2.

Rules this simulator had to add (**guessed**; ARC serves one request at a time):

- Sets: a layer's active experts in one iteration are used together: every hit is served first (in id order, each
  moving to T2's most recent end), then each newcomer (a miss, or a prefetched expert) is handled as above, in id
  order.
- An expert the layer uses now is never evicted: "the oldest of T1 (T2)" is the oldest one not in use now; when the
  list REPLACE picks has none, the other list gives its oldest not in use. When every slot holds an expert in use
  now the newcomer is not admitted, and ARC's state is left as it was (no adaptation of ``p``, no ghost moved).
- Tiers as ``lru`` (``sim.policies.base.PerLayerCache``): no pinned experts by default, the layer's
  ``hpc_slots + mpc_slots`` as ARC's ``c`` (hits count as MPC hits); ``pin_hot: true`` pins the layer's hottest
  ``hpc_slots`` experts and ARC runs on the ``mpc_slots`` others. The cache starts empty and persists across
  batches. Copies land in their slot; prefetching follows the configured predictor.
- Shared cache (``cache.organization: shared``): one ARC whose ``c`` is the shared cache's size, over (layer,
  expert) pairs of every cached layer; "in use now" is the running layer's active experts.
"""

from __future__ import annotations

from collections import OrderedDict

from sim.policies.base import POLICIES, PerLayerCache

ORIGIN = "published"


class ArcLayer:
    """ARC's four lists for one layer (each least recent first) and its target ``p``."""

    __slots__ = ("c", "p", "t1", "t2", "b1", "b2")

    def __init__(self, capacity: int):
        self.c = capacity
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def hit(self, x: int) -> None:
        if x in self.t1:
            del self.t1[x]
        else:
            del self.t2[x]
        self.t2[x] = None

    @staticmethod
    def _oldest(lst, busy):
        return next((v for v in lst if v not in busy), None)

    def _replace(self, in_b2: bool, busy) -> int:
        t1 = self.t1
        n1 = len(t1)
        v1 = self._oldest(t1, busy)
        v2 = self._oldest(self.t2, busy)
        if (n1 >= 1 and (n1 > self.p or (in_b2 and n1 == self.p)) and v1 is not None) or v2 is None:
            del t1[v1]
            self.b1[v1] = None
            return v1
        del self.t2[v2]
        self.b2[v2] = None
        return v2

    def admit(self, x: int, busy) -> tuple[bool, int | None]:
        """A request for ``x``, which is not cached: returns (admitted, evicted expert or None)."""
        c, t1, t2, b1, b2 = self.c, self.t1, self.t2, self.b1, self.b2
        full = len(t1) + len(t2) >= c
        if full and self._oldest(t1, busy) is None and self._oldest(t2, busy) is None:
            return False, None  # every slot holds an expert in use now
        victim = None
        if x in b1:
            self.p = min(float(c), self.p + (1.0 if len(b1) >= len(b2) else len(b2) / len(b1)))
            del b1[x]
            if full:
                victim = self._replace(False, busy)
            t2[x] = None
            return True, victim
        if x in b2:
            self.p = max(0.0, self.p - (1.0 if len(b2) >= len(b1) else len(b1) / len(b2)))
            del b2[x]
            if full:
                victim = self._replace(True, busy)
            t2[x] = None
            return True, victim
        if len(t1) + len(b1) == c:
            if len(t1) < c:
                b1.popitem(last=False)
                if full:
                    victim = self._replace(False, busy)
            else:
                victim = self._oldest(t1, busy)  # |T1| = c: T2 is empty, so one of T1 is free (checked above)
                del t1[victim]
        elif len(t1) + len(t2) + len(b1) + len(b2) >= c:
            if len(t1) + len(t2) + len(b1) + len(b2) == 2 * c:
                b2.popitem(last=False)
            if full:
                victim = self._replace(False, busy)
        t1[x] = None
        return True, victim


@POLICIES.register("arc")
class ARC(PerLayerCache):
    origin = ORIGIN
    supports_shared = True
    admits = "keeper"

    def configure(self) -> None:
        super().configure()
        self.arc = {layer: ArcLayer(self.cache.mpc_slots) for layer in self.ctx.cached_layers}
        # shared: one ARC over the (layer, expert) pairs of every cached layer
        self.arc_all = ArcLayer(self.cache.mpc_slots) if self.shared else None

    def keeper(self, layer: int) -> ArcLayer:
        return self.arc_all if self.arc_all is not None else self.arc[layer]
