"""`belady`: offline optimal replacement for the MPC (Belady's MIN with bypass), reading the workload's future.

It needs the future: ``ctx.iterations`` (the run's list of ``sim.core.workload.Iteration``, in run order) and
``ctx.trace`` (``PolicyContext.future``), which ``sim.decisions.build.build_decisions`` passes. From them, once, per
cached layer, it tabulates every (iteration, active expert) pair and each pair's *next use* (the next iteration in
which that expert is active in that layer), with numpy.

Rule, per cached layer, after the gate (the layer's active experts are used together, as in ``lru``):
the MPC after the step holds the ``mpc_slots`` experts with the soonest next use among the experts in the MPC
and the layer's active experts that are not in the HPC; an expert never used again is not admitted (bypass).
Evicted are the experts used furthest in the future (or never). Ties keep the expert already cached, then the
lower id. Nothing moves when no active expert is a newcomer worth admitting.

**Sets, not single requests.** With top-k > 1 or batch > 1 a layer's step is a *set* of accesses. The rule
above may evict an MPC expert that is active now (after it has computed: promotions happen after compute), and
so picks the best ``mpc_slots`` of the whole pool. This is provably optimal among all demand policies (those
whose new MPC entries are experts active in the step): an exchange argument (swap a kept expert for one with a
sooner next use and follow the other schedule until either is next used) shows no schedule gets more hits.
The textbook variant that never evicts an expert active now (the rule ``lru`` follows) is *not* optimal for
sets: being forced to keep an active expert can cost more hits later than the one it gave (in the 7-step
top-3 example of tests/sim/policies/test_baselines.py it gets 6 hits where the optimum gets 8).

**Warm start** (``warm``, default true): at the start of each batch the MPC is refilled, free, with the experts
whose next use is soonest — the privilege ``diffmoe`` has (its start-of-batch fill from the hot profile) and
``lru``/``lfu`` have in their pinned HPC (with ``pin_hot: true``), so that ``belady`` at HPC+MPC = C slots bounds
every such policy at C slots. ``warm: false`` starts cold and keeps its MPC across batches.

The HPC is optional (``pin_hot``, default false). Without it the configured HPC slots join the MPC
(``hpc_slots + mpc_slots`` MIN slots per cached layer), so that a run config's total capacity is compared as
is; with it, the HPC pins the layer's ``hpc_slots`` hottest experts as ``lru`` with ``pin_hot: true`` does and MIN
runs on the MPC.
``belady_bound`` computes the same hits without an engine.

**Shared cache** (``cache.organization: shared``): one MIN over the whole model's cache of ``shared_slots`` experts
(HPC+MPC by default; less the pinned HPC with ``pin_hot``), the items being (layer, expert) pairs and time the
sequence of layer steps in run order (iteration ``i``'s step of layer ``l`` is ``i x layers + l``; every iteration
runs its layers in ascending order). A step is still a set of accesses (the running layer's active experts); the
rule is the same, the pool being the whole shared MPC plus the step's newcomers, so a victim may be an expert of any
cached layer (or of the running one, after it computed). The exchange argument does not depend on which items the
cache holds, so MIN is optimal here too: no demand policy on the shared cache gets more HPC+MPC hits at that
budget, and since a per-layer schedule (``c`` slots in each of ``n`` cached layers, warm start included) is one
schedule of a shared cache of ``c n`` slots, shared MIN also bounds every per-layer policy (per-layer MIN included)
at equal total slots. The warm start fills the ``shared_slots`` (layer, expert) pairs used soonest.
``belady_bound_shared`` computes the same hits without an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from moebase.errors import ConfigError
from sim.core.cache import LPC, MISS
from sim.core.workload import phase_layers
from sim.policies.base import POLICIES, LayerPlan, Policy

#: What min_step ranks: an expert id (per-layer MIN) or a (layer, expert) pair (the shared cache's MIN).
Key = TypeVar("Key", int, tuple[int, int])

#: "Never used again" as a next-use iteration index.
NEVER = int(np.iinfo(np.int64).max)


class FutureUses:
    """Per layer: the (iteration, expert) pairs where the expert is active, grouped by iteration (CSR), each
    pair's next use, and per expert its sorted uses (for "first use at or after iteration i")."""

    def __init__(self, trace, iterations, layers):
        self.num_experts = n_exp = trace.num_experts
        idx = np.fromiter((it.index for it in iterations), dtype=np.int64, count=len(iterations))
        if idx.size and (np.any(np.diff(idx) <= 0) or idx[0] < 0):
            raise ConfigError("belady: the workload's iterations must be in run order with increasing indices")
        self.n = n = int(idx[-1]) + 1 if idx.size else 0
        sizes = np.fromiter((it.rows.size for it in iterations), dtype=np.int64, count=len(iterations))
        rows = (
            np.concatenate([np.asarray(it.rows, dtype=np.int64) for it in iterations])
            if iterations
            else np.zeros(0, np.int64)
        )
        iter_of_row = np.repeat(idx, sizes)
        phases = phase_layers(trace)
        kind_code = np.fromiter(
            (1 if it.kind == "decode" else 0 for it in iterations), dtype=np.int64, count=len(iterations)
        )
        kind_of_row = np.repeat(kind_code, sizes)
        self.offsets, self.experts, self.next_use, self.keys = {}, {}, {}, {}
        for layer in layers:
            runs = np.array([layer in phases["prefill"], layer in phases["decode"]])
            ids = trace.experts[rows, layer, :].astype(np.int64)  # [rows, k]
            valid = (ids >= 0) & runs[kind_of_row][:, None]
            codes = np.unique((iter_of_row[:, None] * n_exp + ids)[valid])  # sorted by (iteration, expert)
            its, exps = codes // n_exp, codes % n_exp
            order = np.argsort(exps, kind="stable")  # by (expert, iteration)
            s_it, s_ex = its[order], exps[order]
            nxt_sorted = np.full(codes.size, NEVER, dtype=np.int64)
            if codes.size > 1:
                same = s_ex[1:] == s_ex[:-1]
                nxt_sorted[:-1] = np.where(same, s_it[1:], NEVER)
            nxt = np.empty_like(nxt_sorted)
            nxt[order] = nxt_sorted
            self.offsets[layer] = np.searchsorted(its, np.arange(n + 1)).tolist()
            self.experts[layer] = exps.tolist()
            self.next_use[layer] = nxt.tolist()
            self.keys[layer] = s_ex * max(n, 1) + s_it  # sorted: expert-major uses

    def at(self, layer: int, iteration: int) -> tuple[list[int], list[int]]:
        """The layer's active experts in ``iteration`` (ascending) and each one's next use after it."""
        off = self.offsets[layer]
        lo, hi = off[iteration], off[iteration + 1]
        return self.experts[layer][lo:hi], self.next_use[layer][lo:hi]

    def accesses(self, layer: int) -> int:
        return len(self.experts[layer])

    def first_use_from(self, layer: int, iteration: int) -> np.ndarray:
        """Per expert, the first iteration >= ``iteration`` in which it is active in ``layer`` (NEVER if none)."""
        n = max(self.n, 1)
        keys = self.keys[layer]
        e = np.arange(self.num_experts, dtype=np.int64)
        pos = np.searchsorted(keys, e * n + iteration)
        hit = np.minimum(pos, max(keys.size - 1, 0))
        found = (pos < keys.size) & (keys[hit] // n == e) if keys.size else np.zeros(self.num_experts, bool)
        return np.where(found, keys[hit] % n if keys.size else 0, NEVER)


def warm_fill(first_use: np.ndarray, excluded, slots: int) -> list[int]:
    """The ``slots`` experts used soonest (never-used ones left out), ``excluded`` (the HPC) aside."""
    order = np.lexsort((np.arange(first_use.size), first_use))
    return [int(e) for e in order if first_use[e] != NEVER and int(e) not in excluded][:slots]


def min_step(held: Sequence[Key], newcomers: Sequence[Key], next_use, slots: int) -> list[tuple[Key, Key | None]]:
    """One MIN step: ``held`` the MPC (may include experts active now), ``newcomers`` the active experts in
    neither HPC nor MPC, ``next_use[e]`` each one's next use. Returns (admitted expert, evicted expert or None)
    so that the MPC ends up holding the ``slots`` soonest-used experts of the pool (never-used newcomers stay out;
    ties keep the cached expert, then the lower id)."""
    cand: list[Key] = [e for e in newcomers if next_use[e] != NEVER]
    if not cand:
        return []
    new = set(cand)
    pool = sorted([*held, *cand], key=lambda e: (next_use[e], e in new, e))
    keep = set(pool[:slots])
    incoming = [e for e in pool[:slots] if e in new]
    if not incoming:
        return []
    victims = sorted((v for v in held if v not in keep), key=lambda v: (-next_use[v], v))  # furthest first
    free = slots - len(held)
    out: list[tuple[Key, Key | None]] = []
    for j, e in enumerate(incoming):
        out.append((e, None) if j < free else (e, victims[j - max(free, 0)]))
    return out


def record_next_uses(
    future: FutureUses | None, next_use: list[int], iteration: int, layer: int, active, who: str
) -> list[int]:
    """Record in ``next_use`` (one layer's, per expert) the next uses of the step's active experts, checking that the
    active set is the workload's (``who`` names the policy in the error); returns ``next_use``. ``future`` is None
    only for a policy without cached layers, which records nothing."""
    assert future is not None, "a layer with next uses has a future"
    experts, uses = future.at(layer, iteration)
    if len(experts) != len(active) or list(active) != experts:
        raise RuntimeError(
            f"{who}: iteration {iteration}, layer {layer}: active set {list(active)} differs "
            f"from the workload's ({experts}); PolicyContext.iterations is not this run's"
        )
    for e, u in zip(experts, uses):
        next_use[e] = u
    return next_use


@POLICIES.register("belady")
class Belady(Policy):
    """MIN with bypass over the MPC of each cached layer, from the workload's future."""

    origin = "bound"

    PARAMS = {"pin_hot": False, "warm": True}
    promotion_is_free = True  # the copy lands in the slot it will occupy (after the victim has computed)
    supports_shared = True
    admits = "rule"  # MIN over the pool of held experts and newcomers (victims may be active now)

    def hpc_capacity(self, ctx) -> int:
        return ctx.hpc_slots if self.params["pin_hot"] else 0

    def mpc_capacity(self, ctx) -> int:
        return ctx.mpc_slots if self.params["pin_hot"] else ctx.hpc_slots + ctx.mpc_slots

    def configure(self) -> None:
        if self.params["pin_hot"]:
            self.pin_hot_experts()
        self.layers = sorted(self.ctx.cached_layers) if self.cache.mpc_slots > 0 else []
        self.future: FutureUses | None = None
        if self.layers:
            trace, iterations = self.ctx.future("policy belady")
            self.future = FutureUses(trace, iterations, self.layers)
        # per layer, each expert's next use as known at its last use (valid for experts held in the MPC)
        self.next_use = {layer: [NEVER] * self.ctx.num_experts for layer in self.layers}
        self._fill = False
        self._nxt: list[int] = []  # the running layer's next uses (``observe``)

    def start_batch(self) -> None:
        self._fill = self.params["warm"]

    def start_iteration(self, iteration) -> None:
        if not self._fill:
            return
        self._fill = False
        if self.shared:
            self._warm_shared(iteration)
            return
        for layer in self.layers:
            assert self.future is not None  # set by configure whenever there are layers
            first = self.future.first_use_from(layer, iteration.index)
            chosen = warm_fill(first, self.cache.hpc[layer], self.cache.mpc_slots)
            self.cache.fill_mpc(layer, chosen)
            nxt = self.next_use[layer]
            for e in chosen:
                nxt[e] = int(first[e])

    def _warm_shared(self, iteration) -> None:
        """The shared cache's warm start: the ``shared_slots`` (layer, expert) pairs used soonest."""
        cache, n = self.cache, self.ctx.num_layers
        chosen = _shared_warm(self.future, self.layers, iteration.index, cache.hpc, cache.mpc_slots, n)
        for layer in self.layers:
            cache.fill_mpc(layer, [])
        per_layer: dict[int, list[int]] = {layer: [] for layer in self.layers}
        for t, layer, e in chosen:
            per_layer[layer].append(e)
            self.next_use[layer][e] = (t - layer) // n
        for layer, experts in per_layer.items():
            cache.fill_mpc(layer, experts)

    def observe(self, iteration, layer: int, active, plan: LayerPlan) -> None:
        """Record the next uses of the step's active experts (from the workload's future)."""
        self._nxt = record_next_uses(self.future, self.next_use[layer], iteration, layer, active, "belady")

    def choose(self, iteration, layer: int, active, plan: LayerPlan) -> list:
        """One MIN step over the held experts and the layer's newcomers: per layer, or over the (layer, expert)
        pairs of the shared cache (time: the run's sequence of layer steps)."""
        sources = plan.sources
        newcomers = [e for e in active if sources[e] in (MISS, LPC)]
        if not newcomers:
            return []
        cache, nxt = self.cache, self._nxt
        if not self.shared:
            return min_step(list(cache.mpc[layer]), newcomers, nxt, cache.mpc_slots)
        n, next_use = self.ctx.num_layers, self.next_use
        held = [(lyr, v) for lyr in self.layers for v in cache.mpc[lyr]]
        when = {key: shared_time(next_use[key[0]][key[1]], key[0], n) for key in held}
        pairs = [(layer, e) for e in newcomers]
        for key in pairs:
            when[key] = shared_time(nxt[key[1]], layer, n)
        return [(e, victim) for (_, e), victim in min_step(held, pairs, when, cache.mpc_slots)]


def shared_time(iteration: int, layer: int, num_layers: int) -> int:
    """The place of (iteration, layer)'s step in the run's sequence of layer steps (NEVER stays NEVER)."""
    return NEVER if iteration == NEVER else iteration * num_layers + layer


def _shared_warm(future, layers, iteration: int, hpc, slots: int, num_layers: int) -> list[tuple[int, int, int]]:
    """The ``slots`` (time, layer, expert) of the cached layers used soonest from ``iteration`` on (never-used
    ones left out, ``hpc[layer]`` aside), soonest first."""
    pool = []
    for layer in layers:
        first = future.first_use_from(layer, iteration)
        excluded = hpc[layer]
        for e in np.flatnonzero(first != NEVER).tolist():
            if e not in excluded:
                pool.append((shared_time(int(first[e]), layer, num_layers), layer, e))
    pool.sort()
    return pool[:slots]


def _min_access(held: dict, active, when, capacity: int) -> int:
    """One step of a bound's MIN cache ``held`` (keys in insertion order): the ``active`` keys already held are
    hits, the others enter by :func:`min_step` (``when``: each key's next use); returns the hits."""
    newcomers = [key for key in active if key not in held]
    for key, victim in min_step(list(held), newcomers, when, capacity):
        if victim is not None:
            del held[victim]
        held[key] = None
    return len(active) - len(newcomers)


def belady_bound(trace, iterations, capacity_per_layer: int, cached_layers=None, warm: bool = True) -> dict:
    """Hits of a MIN cache of ``capacity_per_layer`` experts in each of ``cached_layers`` (default: all), over
    the workload ``iterations`` of ``trace``, without an engine: exactly the ``belady`` policy's HPC+MPC hits
    with ``hpc_slots + mpc_slots = capacity_per_layer`` and no pinned HPC (``warm`` as its param). No policy
    whose new cache entries are experts active in the step (and whose only free entries are a start-of-batch
    fill or a pinned HPC) gets more hits at that total capacity per layer, the HPC included.

    ``accesses`` counts every (iteration, layer, active expert) of the workload, cached layers or not (as the
    engine's counters do). Returns {"hits", "accesses", "hit_rate"}."""
    layers = list(range(trace.num_layers))
    cached = set(layers if cached_layers is None else cached_layers)
    future = FutureUses(trace, iterations, layers)
    accesses = sum(future.accesses(layer) for layer in layers)
    hits = 0
    if capacity_per_layer > 0:
        starts = [it.index for it in iterations if it.new_batch]
        for layer in sorted(cached):
            off, exps, uses = future.offsets[layer], future.experts[layer], future.next_use[layer]
            nxt = [NEVER] * trace.num_experts
            held: dict[int, None] = {}
            fills = set(starts) if warm else set()
            for it in iterations:
                i = it.index
                if i in fills:
                    first = future.first_use_from(layer, i)
                    held = dict.fromkeys(warm_fill(first, (), capacity_per_layer))
                    for e in held:
                        nxt[e] = int(first[e])
                lo, hi = off[i], off[i + 1]
                if lo == hi:
                    continue
                active = exps[lo:hi]
                for e, u in zip(active, uses[lo:hi]):
                    nxt[e] = u
                hits += _min_access(held, active, nxt, capacity_per_layer)
    return {"hits": hits, "accesses": accesses, "hit_rate": hits / accesses if accesses else 0.0}


def belady_bound_shared(trace, iterations, capacity: int, cached_layers=None, warm: bool = True) -> dict:
    """Hits of a MIN cache of ``capacity`` experts shared by ``cached_layers`` (default: all), over the workload
    ``iterations`` of ``trace``, without an engine: exactly the ``belady`` policy's HPC+MPC hits with
    ``cache.organization: shared``, ``shared_slots = capacity`` and no pinned HPC. No demand policy on a shared
    cache of ``capacity`` experts, and no per-layer policy with ``capacity / cached layers`` slots per layer, gets
    more HPC+MPC hits. Returns {"hits", "accesses", "hit_rate"} (accesses as :func:`belady_bound`)."""
    n = trace.num_layers
    layers = list(range(n))
    cached = sorted(set(layers if cached_layers is None else cached_layers))
    future = FutureUses(trace, iterations, layers)
    accesses = sum(future.accesses(layer) for layer in layers)
    hits = 0
    if capacity > 0 and cached:
        phases = phase_layers(trace)
        run = {kind: [layer for layer in phases[kind] if layer in set(cached)] for kind in phases}
        when: dict[tuple[int, int], int] = {}
        held: dict[tuple[int, int], None] = {}
        no_hpc: list[frozenset[int]] = [frozenset()] * n
        for it in iterations:
            i = it.index
            if warm and it.new_batch:
                held = {}
                for t, layer, e in _shared_warm(future, cached, i, no_hpc, capacity, n):
                    held[(layer, e)] = None
                    when[(layer, e)] = t
            off_i = i
            for layer in run[it.kind]:
                off = future.offsets[layer]
                lo, hi = off[off_i], off[off_i + 1]
                if lo == hi:
                    continue
                exps, uses = future.experts[layer], future.next_use[layer]
                active = [(layer, e) for e in exps[lo:hi]]
                for key, u in zip(active, uses[lo:hi]):
                    when[key] = shared_time(u, layer, n)
                hits += _min_access(held, active, when, capacity)
    return {"hits": hits, "accesses": accesses, "hit_rate": hits / accesses if accesses else 0.0}


__all__ = ["Belady", "FutureUses", "NEVER", "belady_bound", "belady_bound_shared", "min_step", "shared_time"]
