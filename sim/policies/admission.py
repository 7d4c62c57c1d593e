"""The admission driver: the one piece of code that runs a policy's cache step after a layer's gate, on a per-layer
cache (:class:`sim.core.cache.TierCache`) or a shared one (:class:`sim.core.cache.SharedTierCache`).

A policy declares how it admits (``Policy.admits``) and the driver does the rest, in this order, per layer step
(``Policy.plan_layer``, after the sources are classified):

1. ``policy.observe(iteration, layer, active, plan)``: the policy's own bookkeeping of the step (use counts, last
   uses, scores, next uses). Called on a *live* layer (cached, with MPC slots), or on every layer for a policy with
   ``observes_every_layer``.
2. On a live layer only, by ``admits``:

   - ``"rank"``: hits first (with ``touch_hits`` each MPC hit becomes most recent, in active order); then the
     *newcomers* (the active experts copied now: misses and used prefetches, in active order unless the policy's
     ranking reorders them) enter the MPC one by one; a full MPC first evicts the held expert with the largest
     victim key among those **the layer does not use now** (in a per-layer cache ``policy.victim_key(layer,
     active, newcomers)`` gives ``key(expert)``, ties to the first held in MPC order; in a shared cache
     ``policy.shared_victim_keys(layer, active, newcomers)`` gives ``keys(layer_of_held, held) -> keys``, ties to
     the larger ``(layer, expert)``, the keys read once per step). A ranking of None is least recent use: the
     MPC's insertion order per layer, one recency order over every cached layer in a shared cache. A policy that
     overrides
     ``keeps_out(layer, newcomer, victim)`` may refuse a newcomer once its victim is known (bypass). Once every
     slot holds an expert the layer uses now the remaining newcomers are not admitted.
   - ``"keeper"``: a replacement structure (``policy.keeper(layer)``: ARC, S3-FIFO) with ``hit(key)`` and
     ``admit(key, busy) -> (admitted, victim)``, keys being experts (per-layer) or ``(layer, expert)`` pairs
     (shared): each held active expert is a hit (active order), then each newcomer is offered in active order.
   - ``"rule"``: a rule that is not a ranking (Belady's MIN, Diff-MoE's slot walk): ``policy.choose(iteration,
     layer, active, plan)`` returns the ``(newcomer, victim)`` promotions, which the driver applies in order
     (victims as ``(layer, expert)`` pairs in a shared cache).
   - None: the policy keeps nothing in an MPC.

3. ``policy.after_admission(layer, newcomers, plan)`` when a ranked step had newcomers (``plan.promote`` then holds
   what entered and whom it evicted).

Every promotion goes through the cache (which checks its invariants) and into ``plan.promote``: expert -> victim
(an expert, or ``(victim's layer, victim)`` in a shared cache, or None). Hits and misses are not counted here: the
decision protocol (``sim.decisions.protocol``) derives them from the plan.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from sim.core.cache import HPC, LPC, MISS, MPC, TierCache
from sim.policies.layer_plan import LayerPlan

RANK, KEEPER, RULE = "rank", "keeper", "rule"
MODES = (None, RANK, KEEPER, RULE)
#: What :func:`_ranked_victim` answers when every expert held in the MPC is one the layer uses now.
FULL_OF_ACTIVE = object()


def _ranked_victim(mpc: dict, busy, key: Callable[[int], Any] | None) -> Any:
    """The victim a full per-layer MPC gives up for a newcomer: of the held experts not in ``busy`` (the layer's
    active ones), the one with the largest ``key``, or with no key the least recent (the first in ``mpc``'s
    order); ``FULL_OF_ACTIVE`` when there is none."""
    if key is None:
        for victim in mpc:
            if victim not in busy:
                return victim
        return FULL_OF_ACTIVE
    free = [v for v in mpc if v not in busy]
    return max(free, key=key) if free else FULL_OF_ACTIVE


def _overrides(policy: Any, policy_base: type, name: str) -> bool:
    """Whether the policy's class overrides ``name`` of ``policy_base``, the class every policy derives from (a hook the
    driver then calls)."""
    return getattr(type(policy), name) is not getattr(policy_base, name)


class AdmissionDriver:
    """Runs one policy's layer steps against its cache (see the module doc); built once per policy."""

    __slots__ = (
        "policy",
        "cache",
        "live",
        "mode",
        "shared",
        "touch",
        "observe",
        "observe_all",
        "bypass",
        "after",
        "key_of",
        "layers",
        "order",
        "plan",
        "classify",
        "layer_plan",
        "num_experts",
    )

    def __init__(self, policy: Any, policy_base: type):
        mode = policy.admits
        if mode not in MODES:
            raise TypeError(f"policy {policy.name!r}: admits must be one of {MODES}, got {mode!r}")
        self.policy = policy
        self.cache = policy.cache
        #: the layers the driver admits into: cached, with MPC slots (a cache's slots never change)
        self.live = frozenset(policy.ctx.cached_layers) if self.cache.mpc_slots > 0 else frozenset()
        self.mode = mode
        self.shared = bool(self.cache.shared)
        self.touch = bool(policy.touch_hits)
        self.observe = policy.observe if mode is not None and _overrides(policy, policy_base, "observe") else None
        self.observe_all = bool(policy.observes_every_layer)
        self.bypass = policy.keeps_out if _overrides(policy, policy_base, "keeps_out") else None
        self.after = policy.after_admission if _overrides(policy, policy_base, "after_admission") else None
        #: the per-layer victim key (None: least recent use, without asking)
        self.key_of = policy.victim_key if _overrides(policy, policy_base, "victim_key") else None
        self.layers = sorted(policy.ctx.cached_layers)  # ascending: the run order of the cached layers
        #: the shared cache's recency order ((layer, expert), least recent first), for a ranking of None
        self.order: dict[tuple[int, int], None] = {}
        self.layer_plan = LayerPlan
        self.num_experts = self.cache.num_experts
        self.classify = policy.classify
        #: ``plan(iteration, layer, active)``: the layer's plan (classified, then admitted). A per-layer ranking
        #: that observes nothing and keeps the base ``classify`` is one pass (``_plan_ranked``): the same
        #: sources, lists and promotions as ``classify`` then ``step``, without building them twice
        fused = (
            mode == RANK
            and type(self.cache) is TierCache
            and self.observe is None
            and not _overrides(policy, policy_base, "classify")
        )
        self.plan = self._plan_ranked if fused else self._plan_general

    def _plan_general(self, iteration: int, layer: int, active: Sequence[int]):
        """The policy's ``classify``, then the driver's step."""
        plan = self.classify(layer, active)
        self.step(iteration, layer, active, plan)
        return plan

    def _plan_ranked(self, iteration: int, layer: int, active: Sequence[int]):
        """``Policy.classify`` and ``_rank_per_layer`` in one pass: each active expert's source (a miss entering
        its working buffer), an MPC hit made most recent as it is met (``touch_hits``: the hits in active order, as
        ``_rank_per_layer`` does them; classifying reads membership only, which touching keeps), then the
        newcomers' admission."""
        cache = self.cache
        hpc, mpc, lpc = cache.hpc[layer], cache.mpc[layer], cache.lpc_of[layer]
        prefetched = len(lpc)
        live = layer in self.live
        touch = live and self.touch
        n = self.num_experts
        sources: dict[int, str] = {}
        resident: list[int] = []
        copied: list[tuple[int, str]] = []
        newcomers: list[int] = []
        n_lpc = 0
        for e in active:
            if e in hpc:
                sources[e] = HPC
                resident.append(e)
            elif e in mpc:
                sources[e] = MPC
                resident.append(e)
                if touch:
                    del mpc[e]
                    mpc[e] = None
            elif e in lpc:
                sources[e] = LPC
                copied.append((e, LPC))
                newcomers.append(e)
                n_lpc += 1
            else:
                if not 0 <= e < n:  # cache.add_lpc's check (the others hold: the expert is in no tier)
                    cache.add_lpc(layer, e)
                lpc.add(e)
                sources[e] = MISS
                copied.append((e, MISS))
                newcomers.append(e)
        # prefetches this layer did not use: in a buffer before, not active now
        unused = sorted(lpc.difference(sources)) if prefetched > n_lpc else []
        promote: dict = {}
        plan = self.layer_plan(sources, promote, unused, resident, copied, prefetch_hits=n_lpc)
        if not newcomers or not live:
            return plan
        key_of = self.key_of
        key = key_of(layer, active, newcomers) if key_of is not None else None
        bypass, slots = self.bypass, cache.mpc_slots
        busy = sources  # the layer's active experts
        # each promotion as ``TierCache.promote`` makes it, whose checks hold here by construction (the newcomer is
        # in its working buffer, the layer is cached, the victim is held in the MPC, which then has room): the
        # expert enters the MPC, the victim leaves it, and the counters add them up once the step is done
        admitted = evicted = 0
        for e in newcomers:
            victim = None
            if len(mpc) >= slots:
                if key is None:  # _ranked_victim, inline (once per eviction): the least recent not in use now
                    for victim in mpc:
                        if victim not in busy:
                            break
                    else:
                        break  # every slot holds an expert this layer uses now
                else:
                    victim = _ranked_victim(mpc, busy, key)
                    if victim is FULL_OF_ACTIVE:
                        break  # every slot holds an expert this layer uses now
                if bypass is not None and bypass(layer, e, victim):
                    continue
                del mpc[victim]
                evicted += 1
            mpc[e] = None
            promote[e] = victim
            admitted += 1
        if admitted:
            counters = cache.counters
            counters.evictions += evicted
            counters.promotions += admitted
            counters.insertions += admitted
        if self.after is not None:
            self.after(layer, newcomers, plan)
        return plan

    def step(self, iteration: int, layer: int, active: Sequence[int], plan) -> None:
        """The layer's step after classification: observe, then hits and admissions by the policy's mode."""
        live = layer in self.live
        observe = self.observe
        if observe is not None and (live or self.observe_all):
            observe(iteration, layer, active, plan)
        if not live:
            return
        mode = self.mode
        if mode == RANK:
            if self.shared:
                self._rank_shared(layer, active, plan)
            else:
                self._rank_per_layer(layer, active, plan)
        elif mode == RULE:
            self._apply(layer, plan, self.policy.choose(iteration, layer, active, plan))
        elif mode == KEEPER:
            self._keeper_step(layer, active, plan)

    # ------------------------------------------------------------------------------------------------ ranked
    @staticmethod
    def _newcomers(active: Sequence[int], plan) -> list[int]:
        """The experts the layer copies now (misses and used prefetches), in active order."""
        return [e for e, _ in plan.split(active)[1]]

    def _rank_per_layer(self, layer: int, active: Sequence[int], plan) -> None:
        """Per-layer: the MPC hits become most recent (``touch_hits``, in active order); then each newcomer enters,
        a full MPC first evicting the held expert not in use now with the largest victim key (none declared: the
        least recent, i.e. the first in MPC order), unless the policy keeps the newcomer out. One method, the hot
        path of every per-layer ranking."""
        cache, sources = self.cache, plan.sources
        mpc = cache.mpc[layer]
        if self.touch:
            for e in plan.resident if plan.resident is not None else active:
                if sources[e] == MPC:
                    del mpc[e]
                    mpc[e] = None
        newcomers = self._newcomers(active, plan)
        if not newcomers:
            return
        key_of = self.key_of
        key = key_of(layer, active, newcomers) if key_of is not None else None
        bypass, promote, slots, busy = self.bypass, plan.promote, cache.mpc_slots, set(active)
        for e in newcomers:
            victim = None
            if len(mpc) >= slots:
                victim = _ranked_victim(mpc, busy, key)
                if victim is FULL_OF_ACTIVE:
                    break  # every slot holds an expert this layer uses now
                if bypass is not None and bypass(layer, e, victim):
                    continue
            cache.promote(layer, e, victim)
            promote[e] = victim
        if self.after is not None:
            self.after(layer, newcomers, plan)

    def _rank_shared(self, layer: int, active: Sequence[int], plan) -> None:
        """Shared: the MPC hits become most recent in the whole cache's order (``touch_hits``); then the newcomers
        enter by the policy's shared keys, or by least recent use."""
        if self.touch:
            sources, order = plan.sources, self.order
            for e in plan.resident if plan.resident is not None else active:
                if sources[e] == MPC:
                    key = (layer, e)
                    del order[key]
                    order[key] = None
        newcomers = self._newcomers(active, plan)
        if not newcomers:
            return
        keys = self.policy.shared_victim_keys(layer, active, newcomers)
        if keys is None:
            self._admit_shared_recency(layer, active, plan, newcomers)
        else:
            self._admit_shared_ranked(layer, active, plan, keys, newcomers)
        if self.after is not None:
            self.after(layer, newcomers, plan)

    def _admit_shared_ranked(self, layer: int, active, plan, keys: Callable, newcomers: list[int]) -> None:
        """Shared: each newcomer enters; a full cache first evicts, among the experts of every cached layer but
        those the running layer uses now, the one with the largest ``(key, layer, expert)`` (keys read once per
        step: the held experts' keys do not change within it)."""
        cache, promote, bypass = self.cache, plan.promote, self.bypass
        cands: list[tuple[Any, int, int]] | None = None
        for i, e in enumerate(newcomers):
            if cache.mpc_size() < cache.mpc_slots:
                cache.promote(layer, e, None)
                promote[e] = None
                continue
            if cands is None:
                busy = set(active)
                mpcs = cache.mpc
                cands = []
                for lay in self.layers:
                    held = [v for v in mpcs[lay] if v not in busy] if lay == layer else list(mpcs[lay])
                    if held:
                        cands.extend(zip(keys(lay, held), itertools.repeat(lay), held))
                cands = heapq.nlargest(len(newcomers) - i, cands)[::-1]  # at most one victim per newcomer
            if not cands:
                break  # every slot holds an expert this layer uses now
            _, vl, v = cands[-1]
            if bypass is not None and bypass(layer, e, (vl, v)):
                continue
            cands.pop()
            cache.promote(layer, e, v, vl)
            promote[e] = (vl, v)

    def _admit_shared_recency(self, layer: int, active, plan, newcomers: list[int]) -> None:
        """Shared, least recent use: the victim is the least recent (layer, expert) of every cached layer but the
        experts the running layer uses now; each newcomer becomes most recent."""
        cache, order, promote = self.cache, self.order, plan.promote
        slots, busy = cache.mpc_slots, set(active)
        for e in newcomers:
            victim = None
            if cache.mpc_size() >= slots:
                for victim in order:
                    if victim[0] != layer or victim[1] not in busy:
                        break
                else:
                    break  # every slot holds an expert this layer uses now
                del order[victim]
                cache.promote(layer, e, victim[1], victim[0])
            else:
                cache.promote(layer, e, None)
            order[(layer, e)] = None
            promote[e] = victim

    # ------------------------------------------------------------------------------------------ keeper, rule
    def _keeper_step(self, layer: int, active: Sequence[int], plan) -> None:
        """A replacement structure's step: hits in active order, then each newcomer offered in active order."""
        keeper = self.policy.keeper(layer)
        cache, promote = self.cache, plan.promote
        mpc = cache.mpc[layer]
        newcomers = self._newcomers(active, plan)  # none of them is held: a held expert is a hit
        if self.shared:
            for e in active:
                if e in mpc:
                    keeper.hit((layer, e))
            busy = {(layer, e) for e in active}
            for e in newcomers:
                admitted, victim = keeper.admit((layer, e), busy)
                if admitted:
                    if victim is None:
                        cache.promote(layer, e, None)
                    else:
                        cache.promote(layer, e, victim[1], victim[0])
                    promote[e] = victim
            return
        for e in active:
            if e in mpc:
                keeper.hit(e)
        busy_set = set(active)
        for e in newcomers:
            admitted, victim = keeper.admit(e, busy_set)
            if admitted:
                cache.promote(layer, e, victim)
                promote[e] = victim

    def _apply(self, layer: int, plan, pairs) -> None:
        """A rule's promotions, in order: (newcomer, victim), the victim an expert of ``layer`` (per-layer) or a
        ``(layer, expert)`` pair (shared), or None."""
        cache, promote = self.cache, plan.promote
        for e, victim in pairs:
            if victim is None:
                cache.promote(layer, e, None)
            elif self.shared:
                cache.promote(layer, e, victim[1], victim[0])
            else:
                cache.promote(layer, e, victim)
            promote[e] = victim


__all__ = ["AdmissionDriver", "KEEPER", "MODES", "RANK", "RULE"]
