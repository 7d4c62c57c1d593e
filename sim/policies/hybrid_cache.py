"""`hybrid-cache` (ours): a GPU expert cache plus the host CPU as a second place to compute the experts
it does not hold. Per layer, each active expert that is not cached nor prefetched is either computed on the host
(source ``cpu``: only its tokens' activations cross the link) or copied (a miss) and offered to the cache,
whichever finishes the layer sooner, with credit for a copy that is likely to be used again.

The rule (every number in it is a guess, named as such; costs from the run's cost model, ``ctx.costs``):

- **Cache**: all ``hpc_slots + mpc_slots`` slots of a cached layer are one cache (no pinned HPC; its hits count
  as MPC hits) whose copies land in their slots (``promotion_is_free``). With ``warm_start`` (default, as fiddler
  and ktransformers start from the hot-expert profile) it starts holding the layer's hottest experts
  (``cache.hot_profile``; without it, 321 tokens/s instead of 333 in the measurement below). Each expert of a layer
  carries a reuse estimate ``p``: an exponential moving average,
  per iteration, of whether the expert was active (``half_life`` iterations, default 16: a guess).
- **Host or copy** (per layer, the non-resident active experts taken from the most tokens down, ties by id):
  the policy keeps two finish estimates, the GPU's ``G`` (the resident and prefetched experts' compute, then each
  copy in the link's queue: ``max(G, (q + k + 1) copy_s) + expert_s(n)`` for the layer's ``k``-th new copy behind
  the ``q`` copies prefetched for the layer, which it counts as still queued: a guess) and the host's ``C``
  (activations both ways for the tokens sent so far, ``min(tokens, sum of their counts)``, plus the host experts
  one after another). An expert goes to the host when that gives the smaller layer finish ``max(G, C)``, unless
  copying it is within its reuse credit ``horizon x (p - p_victim) x (cpu_expert_s(n) - expert_s(n))``, where
  ``p`` counts this use and ``p_victim`` is the reuse estimate of the held expert the copy would displace (0 for a
  free slot; each credited copy takes the next lowest; no credit when the copy would not be admitted), ``horizon``
  16 iterations (a guess: the host time the kept copy saves while it stays, less what the victim would have). So at
  few tokens most misses run on the host (a copy costs ~copy_s, the host a memory-bound pass over the weights),
  the link still carries copies as long as they land before the host is done, and experts with many tokens or a
  high reuse estimate are copied.
- **Admission** (expected reuse): each copied expert (a miss or a used prefetch), in active order, enters the
  layer's cache when a slot is free, else replaces the held expert of the lowest ``p`` not in use now, if its own
  ``p`` (this use counted) is at least that (ties: the lower id is evicted). A host expert never enters the cache.
- **Prefetch** (with the configured predictor; none without one): of the next layer's predicted experts neither
  cached nor in flight, those the cache would admit (a free slot, or ``p`` + this use at least the lowest held
  ``p``), highest ``p`` first, at most ``max_prefetch`` per layer. Default 0 (off), measured: on gpt-oss-20b on
  the h200, batch 1, 20 requests, the oracle predictor and ``max_prefetch`` 1 (2) gave 290 (273) tokens/s against 333
  without (defaults otherwise): a copy takes ~260 us there, longer than a layer (~135 us), so a prefetched expert the
  layer then has to wait for costs more than the host would have taken (a prefetched expert is in a working
  buffer and is computed from it).

Why a frequency (EMA) cache rather than ``next-use-odds``' learned scores or LRU: with the host absorbing the cold
misses, the cache only sees copies the cost rule already filtered, and the choice it faces is "which of these
experts is used most often from now on"; a decayed frequency answers that with no training and reuses the same
number the host-or-copy rule prices reuse with. LRU evicts an often-used expert after one quiet spell.
"""

from __future__ import annotations

import numpy as np

from sim.config.params import MAX_EXPERTS, between
from sim.core.cache import CPU, LPC, MISS, MPC
from sim.costs.costs import Memo
from sim.policies.base import POLICIES, LayerPlan, Policy, PolicyContext
from sim.policies.fiddler import cost_model


@POLICIES.register("hybrid-cache")
class HybridCache(Policy):
    origin = "ours"
    default_predictor = "none"  # it prefetches nothing by default (max_prefetch 0)
    wants_counts = True
    promotion_is_free = True
    admits = "rank"
    PARAMS = {"half_life": 16.0, "horizon": 16.0, "warm_start": True, "max_prefetch": 0}
    # half_life: iterations, above 0 (0 would divide by zero); horizon: iterations of reuse credit, 0 (none) and up;
    # max_prefetch: experts per layer, 0 (off) up to the most experts a layer can have
    PARAM_RULES = {
        "half_life": between(0.0, 1e6, above=True),
        "horizon": between(0.0, 1e6),
        "max_prefetch": between(0, MAX_EXPERTS, kind=int),
    }

    def hpc_capacity(self, ctx: PolicyContext) -> int:
        return 0

    def mpc_capacity(self, ctx: PolicyContext) -> int:
        return ctx.hpc_slots + ctx.mpc_slots

    @classmethod
    def reads_predictions(cls, params: dict) -> bool:
        """Only with ``max_prefetch`` above 0 (the default, 0, prefetches nothing)."""
        return int(params.get("max_prefetch", 0)) > 0

    def configure(self) -> None:
        p = self.params  # in range: checked by PARAM_RULES when the config loads (and when constructed)
        half_life, horizon = float(p["half_life"]), float(p["horizon"])
        self.decay = 0.5 ** (1.0 / half_life)
        self.horizon = horizon
        self.max_prefetch = int(p["max_prefetch"])
        c = self.costs = cost_model(self)
        self.copy_s = c.copy_s(c.expert_bytes)
        self.gpu_of = Memo(c.expert_s)
        self.cpu_of = Memo(c.cpu_expert_s)
        self.act_of = Memo(lambda n: c.activation_copy_s(n, "d2h") + c.activation_copy_s(n, "h2d"))
        ctx = self.ctx
        self.p = np.zeros((ctx.num_layers, ctx.num_experts))
        self.seen = [-1] * ctx.num_layers  # the iteration each layer's estimates were last decayed to
        self.n_tok = 1
        if p["warm_start"] and self.cache.mpc_slots:
            for layer in sorted(ctx.cached_layers):
                self.cache.fill_mpc(layer, ctx.hot_ranking[layer][: self.cache.mpc_slots])

    def plan_prefetch(self, iteration: int, layer: int, predicted) -> list[int]:
        """Of the predicted experts of the next layer neither cached nor in flight, those the cache would admit now
        (a free slot, or a reuse estimate at least the lowest held one's), highest estimate first (ties by id), at
        most ``max_prefetch`` per layer (default 0: off, see the module doc)."""
        cap = self.max_prefetch
        if not predicted or not cap or layer not in self.ctx.cached_layers or not self.cache.mpc_slots:
            return []
        cache = self.cache
        mpc, lpc, p = cache.mpc[layer], cache.lpc_of[layer], self.p[layer]
        floor = min(p[v] for v in mpc) if len(mpc) >= cache.mpc_slots else -1.0
        gain = 1.0 - self.decay
        cands = sorted(
            (e for e in predicted if e not in mpc and e not in lpc and p[e] + gain >= floor), key=lambda e: (-p[e], e)
        )[:cap]
        for e in cands:
            cache.add_lpc(layer, e)
        return cands

    def start_iteration(self, iteration) -> None:
        self.n_tok = int(iteration.rows.size)

    def plan_layer(self, iteration: int, layer: int, active) -> LayerPlan:
        cache, counts = self.cache, self.layer_counts
        assert counts is not None  # wants_counts: the protocol sets them before plan_layer
        mpc, lpc = cache.mpc[layer], cache.lpc_of[layer]
        p = self.p[layer]
        last = self.seen[layer]
        if last != iteration:  # the estimates decay once per iteration the layer runs in
            if last >= 0:
                p *= self.decay ** (iteration - last)
            self.seen[layer] = iteration
        gpu_of, cpu_of = self.gpu_of, self.cpu_of
        sources = {}
        prefetched = len(lpc)
        G = 0.0
        q = 0
        cands = []
        for e in active:
            if e in mpc:
                sources[e] = MPC
                G += gpu_of[counts[e]]
            elif e in lpc:
                sources[e] = LPC
                G += gpu_of[counts[e]]
                q += 1
            else:
                cands.append(e)
        if cands:
            keeps = layer in self.ctx.cached_layers and cache.mpc_slots > 0
            horizon, copy_s, act_of, n_tok = self.horizon, self.copy_s, self.act_of, self.n_tok
            gain = 1.0 - self.decay
            if keeps:  # the slots a copy could take: free ones, then the held experts not in use, lowest p first
                free = cache.mpc_slots - len(mpc)
                busy = set(active)
                victims = sorted(float(p[v]) for v in mpc if v not in busy)
                vi = 0
            cands.sort(key=lambda e: (-counts[e], e))
            C = host = 0.0
            sent = k = 0
            for e in cands:
                n = counts[e]
                g = max(G, (q + k + 1) * copy_s) + gpu_of[n]
                t = min(n_tok, sent + n)
                c = act_of[t] + host + cpu_of[n]
                credit = 0.0
                takes = None
                if keeps:  # what keeping the copy is worth: its reuse over the horizon, less its victim's
                    pe = float(p[e]) + gain
                    if free > 0:
                        takes, credit = "free", pe
                    elif vi < len(victims) and pe >= victims[vi]:
                        takes, credit = "victim", pe - victims[vi]
                    credit *= horizon * (cpu_of[n] - gpu_of[n])
                if max(g - credit, C) <= max(G, c):
                    sources[e] = MISS
                    G = g
                    k += 1
                    cache.add_lpc(layer, e)
                    if takes == "free":
                        free -= 1
                    elif takes == "victim":
                        vi += 1
                else:
                    sources[e] = CPU
                    host += cpu_of[n]
                    sent, C = t, c
        resident, copied, cpu = [], [], []
        for e in active:
            src = sources[e]
            if src == MPC:
                resident.append(e)
            elif src == CPU:
                cpu.append(e)
            else:
                copied.append((e, src))
        unused = sorted(e for e in lpc if e not in sources) if prefetched > q else []
        plan = LayerPlan(sources, {}, unused, resident, copied, cpu)
        # this use counts in the estimates (an EMA of "active in the iteration")
        idx = list(active)
        p[idx] += 1.0 - self.decay
        self.driver.step(iteration, layer, active, plan)  # admission (expected reuse): victim_key, keeps_out
        return plan

    # ------------------------------------------------------------------------------------------ admission
    def victim_key(self, layer: int, active, newcomers: list[int]):
        """The held expert of the lowest reuse estimate goes first (ties: the higher id)."""
        p = self.p[layer]
        return lambda v: (-p[v], v)

    def keeps_out(self, layer: int, expert: int, victim) -> bool:
        """A copy whose reuse estimate (this use counted) is below its victim's is not kept."""
        p = self.p[layer]
        return bool(p[expert] < p[victim])
