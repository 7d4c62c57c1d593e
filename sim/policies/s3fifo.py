"""`s3fifo`: S3-FIFO (Yang, Zhang, Qiu, Yue, Vinayak, "FIFO queues are all you need for cache eviction", SOSP 2023),
one per cached layer.

S3-FIFO as its authors' simulator runs it (libCacheSim ``S3FIFOv0.c``, "the original S3FIFO implementation used in"
the paper; defaults ``small-size-ratio=0.10, ghost-size-ratio=0.90, move-to-main-threshold=2``), on the ``c`` slots
of a layer: a small FIFO queue S, a main FIFO queue M and a ghost FIFO G of ids (no data).

- Each cached expert has a frequency counter, 0 when it enters S or M, +1 per hit, capped at 3 (two bits).
- A newcomer enters M if its id is in G (the id leaves G), else S.
- While the cache is full, one expert is evicted: from M if M holds more than its share (``c`` minus S's share) or
  S is empty, else from S.
- Evicting from S: its oldest expert moves to M (counter reset to 0) if its counter is at least ``move_to_main``,
  and the next oldest is examined; the first one below the threshold leaves the cache and its id enters G (the
  oldest id of G is dropped when G holds more than its size).
- Evicting from M (a CLOCK with two-bit counters): its oldest expert goes back to M's newest end with its counter
  ``min(counter, 3) - 1`` if the counter is at least 1; the first one at 0 leaves the cache.

Rules this simulator had to choose (**guessed**; S3-FIFO serves one request at a time and sizes queues in bytes of
many objects, here a few slots):

- Queue sizes: S holds ``max(1, floor(small_ratio c))`` slots (the paper's 10% floors to 0 for fewer than 10 slots;
  with ``c = 1`` S is the whole cache and M's share is 0), M the others; G holds ``floor(ghost_ratio c)`` ids (no
  ghost when that is 0). ``small_ratio`` (0.1), ``ghost_ratio`` (0.9) and ``move_to_main`` (2) are params.
- Sets: a layer's active experts in one iteration are used together: every hit is counted first, then each newcomer
  (a miss, or a prefetched expert) is inserted in id order, each after one eviction if the cache is full.
- An expert the layer uses now is never evicted: the queue walks skip experts in use now (they keep their place and
  counter); S "is empty" when it holds no expert out of use, and M is used in S's stead when all of S is in use
  (and the other way round). When every slot holds an expert in use now the newcomer is not admitted; its ghost id,
  if any, is still consumed.
- Tiers as ``lru`` (``sim.policies.base.PerLayerCache``): no pinned experts by default, the layer's
  ``hpc_slots + mpc_slots`` as the cache (hits count as MPC hits); ``pin_hot: true`` pins the layer's hottest
  ``hpc_slots`` experts and S3-FIFO runs on the ``mpc_slots`` others. The cache starts empty and persists across
  batches. Copies land in their slot; prefetching follows the configured predictor.
- Shared cache (``cache.organization: shared``): one S3-FIFO sized by the shared cache, over (layer, expert) pairs
  of every cached layer; "in use now" is the running layer's active experts.
"""

from __future__ import annotations

from collections import OrderedDict

from sim.config.params import between
from sim.policies.base import POLICIES, PerLayerCache

ORIGIN = "published"


class S3FifoLayer:
    """S, M (each oldest first) and G for one layer, with the counters of the cached experts."""

    __slots__ = ("c", "small_size", "main_size", "ghost_size", "threshold", "s", "m", "g", "freq")

    def __init__(self, capacity: int, small_ratio: float, ghost_ratio: float, threshold: int):
        self.c = capacity
        self.small_size = max(1, int(small_ratio * capacity)) if capacity else 0
        self.main_size = capacity - self.small_size
        self.ghost_size = int(ghost_ratio * capacity)
        self.threshold = threshold
        self.s: OrderedDict[int, None] = OrderedDict()
        self.m: OrderedDict[int, None] = OrderedDict()
        self.g: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def hit(self, x: int) -> None:
        self.freq[x] = min(self.freq[x] + 1, 3)

    def _evict_small(self, busy) -> int | None:
        """Walk S from its oldest free expert: move the frequent ones to M; evict the first infrequent one."""
        s, freq = self.s, self.freq
        for x in [v for v in s if v not in busy]:
            del s[x]
            if freq[x] >= self.threshold:
                self.m[x] = None
                freq[x] = 0
                continue
            del freq[x]
            if self.ghost_size:
                self.g[x] = None
                if len(self.g) > self.ghost_size:
                    self.g.popitem(last=False)
            return x
        return None

    def _evict_main(self, busy) -> int | None:
        """CLOCK over M's free experts: give each a second chance per counter unit; evict the first at 0."""
        m, freq = self.m, self.freq
        while True:
            x = next((v for v in m if v not in busy), None)
            if x is None:
                return None
            del m[x]
            if freq[x] >= 1:
                m[x] = None
                freq[x] = min(freq[x], 3) - 1
                continue
            del freq[x]
            return x

    def _evict(self, busy) -> int | None:
        while True:
            s_free = any(v not in busy for v in self.s)
            m_free = any(v not in busy for v in self.m)
            if not s_free and not m_free:
                return None
            if m_free and (len(self.m) > self.main_size or not s_free):
                return self._evict_main(busy)
            victim = self._evict_small(busy)
            if victim is not None:
                return victim
            # every free expert of S moved to M: evict from M next

    def admit(self, x: int, busy) -> tuple[bool, int | None]:
        """A request for ``x``, which is not cached: returns (admitted, evicted expert or None)."""
        ghost = x in self.g
        if ghost:
            del self.g[x]
        victim = None
        if len(self.s) + len(self.m) >= self.c:
            victim = self._evict(busy)
            if victim is None:
                return False, None
        (self.m if ghost else self.s)[x] = None
        self.freq[x] = 0
        return True, victim


@POLICIES.register("s3fifo")
class S3FIFO(PerLayerCache):
    origin = ORIGIN
    supports_shared = True
    admits = "keeper"
    PARAMS = {**PerLayerCache.PARAMS, "small_ratio": 0.1, "ghost_ratio": 0.9, "move_to_main": 2}
    PARAM_RULES = {
        **PerLayerCache.PARAM_RULES,
        "small_ratio": between(0.0, 1.0),
        "ghost_ratio": between(0.0, 16.0),
        "move_to_main": between(1, 3, kind=int),
    }

    def configure(self) -> None:
        super().configure()
        p = self.params
        self.s3 = {
            layer: S3FifoLayer(self.cache.mpc_slots, p["small_ratio"], p["ghost_ratio"], p["move_to_main"])
            for layer in self.ctx.cached_layers
        }
        # shared: one S3-FIFO over the (layer, expert) pairs of every cached layer
        self.s3_all = (
            S3FifoLayer(self.cache.mpc_slots, p["small_ratio"], p["ghost_ratio"], p["move_to_main"])
            if self.shared
            else None
        )

    def keeper(self, layer: int) -> S3FifoLayer:
        return self.s3_all if self.s3_all is not None else self.s3[layer]
