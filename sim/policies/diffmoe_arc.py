"""`diffmoe-arc`: Diff-MoE's tiers with an MPC that adapts, per layer, between recency and frequency (our policy).

Diff-MoE's priority score is one fixed blend of recency and frequency (+1 when used, fixed decays, a fixed
admission threshold). Which blend pays depends on the layer and the load: at batch 1 a layer's next experts are
mostly its recent ones, at mid batch sizes more new experts arrive per iteration than the MPC has slots and the
threshold keeps stale occupants, at large batches frequency wins. This policy keeps Diff-MoE's HPC (the layer's
hot experts, pinned), its shared working buffers and device-to-device promotion, and manages each layer's MPC
with ARC (Megiddo and Modha, FAST 2003): the MPC is split into a recency list T1 (experts used once since they
entered) and a frequency list T2 (used again), with ghost lists B1 and B2 remembering recent evictions; a use of
an expert in B1 (evicted from T1 too early) grows T1's target share ``p``, a use of one in B2 shrinks it. So each
layer learns its own split from the hits it would have had. One change to ARC (``t2_lfu``, on by default): T2
evicts its least frequently used expert (uses in the layer since the run started; ties least recent), not its
least recent one, because expert popularity is skewed and lasting (measured: +2.6 points of hit rate on the
synthetic Switch-XXL trace at batch 1, never worse on the others we ran).

Batches: a layer's experts used in one iteration are used together; hits are refreshed first, then each new
expert is admitted in router order, never evicting an expert the layer uses now (if every occupant is in use,
the newcomer is not admitted). With ``hit_d2d`` (default on, as Diff-MoE's artifact) a cached expert is copied
into the working arena before it computes, so that comparisons with ``diffmoe`` isolate the replacement rule.
"""

from __future__ import annotations

from collections import OrderedDict

from sim.policies.base import POLICIES, LayerPlan, Policy


class _ARC:
    """ARC state of one layer: T1, T2 (in the MPC), B1, B2 (ghosts), all least recent first."""

    __slots__ = ("c", "p", "t1", "t2", "b1", "b2", "freq")

    def __init__(self, capacity: int, freq=None):
        self.c = capacity
        self.freq = freq  # if given (a list of use counts), T2 evicts its least frequently used expert
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def hit(self, e: int) -> None:
        self.t1.pop(e, None)
        self.t2.pop(e, None)
        self.t2[e] = None

    def _oldest(self, lst: OrderedDict, busy: set) -> int | None:
        return next((x for x in lst if x not in busy), None)

    def _replace(self, in_b2: bool, busy: set) -> int | None:
        """Evict from T1 or T2 into its ghost list; returns the victim (None if every occupant is busy)."""
        v1 = self._oldest(self.t1, busy)
        if self.freq is None:
            v2 = self._oldest(self.t2, busy)
        else:
            free = [x for x in self.t2 if x not in busy]
            v2 = min(free, key=self.freq.__getitem__) if free else None
        take_t1 = v1 is not None and (len(self.t1) > self.p or (in_b2 and len(self.t1) == int(self.p)) or v2 is None)
        if take_t1:
            assert v1 is not None  # take_t1 implies it
            del self.t1[v1]
            self.b1[v1] = None
            return v1
        if v2 is not None:
            del self.t2[v2]
            self.b2[v2] = None
            return v2
        return None

    def admit(self, e: int, busy: set) -> tuple[bool, int | None]:
        """A new expert arrives: returns (admitted, victim)."""
        c = self.c
        victim = None
        full = len(self.t1) + len(self.t2) >= c
        if e in self.b1:
            self.p = min(c, self.p + max(len(self.b2) / len(self.b1), 1.0))
            del self.b1[e]
            if full:
                victim = self._replace(False, busy)
                if victim is None:
                    return False, None
            self.t2[e] = None
            return True, victim
        if e in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            del self.b2[e]
            if full:
                victim = self._replace(True, busy)
                if victim is None:
                    return False, None
            self.t2[e] = None
            return True, victim
        if len(self.t1) + len(self.b1) >= c:
            if len(self.t1) < c:
                if self.b1:
                    self.b1.popitem(last=False)
                if full:
                    victim = self._replace(False, busy)
            else:
                victim = self._oldest(self.t1, busy)
                if victim is not None:
                    del self.t1[victim]
        elif full:
            if len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) >= 2 * c and self.b2:
                self.b2.popitem(last=False)
            victim = self._replace(False, busy)
        if full and victim is None:
            return False, None
        self.t1[e] = None
        return True, victim


@POLICIES.register("diffmoe-arc")
class DiffMoEARC(Policy):
    origin = "ours"
    default_predictor = "oracle"
    admits = "keeper"
    PARAMS = {"hit_d2d": True, "t2_lfu": True}

    def configure(self) -> None:
        self.hit_d2d = bool(self.params["hit_d2d"])
        self.arc = {}
        self.pin_hot_experts()
        for layer in self.ctx.cached_layers:
            self.arc[layer] = _ARC(self.cache.mpc_slots, [0] * self.ctx.num_experts if self.params["t2_lfu"] else None)

    def observe(self, iteration, layer: int, active, plan: LayerPlan) -> None:
        """``t2_lfu``: count the layer's uses (T2's eviction order)."""
        freq = self.arc[layer].freq
        if freq is not None:
            for e in active:
                freq[e] += 1

    def keeper(self, layer: int) -> _ARC:
        return self.arc[layer]
