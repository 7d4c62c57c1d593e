"""`diffmoe`: Diff-MoE's priority-driven differential expert caching (SC 2025), as its artifact implements it
(``ceciliawinter/Diff-MoE``, ``src/fastertransformer/utils/fetcher.cc``); DESIGN 2.2 states the rules.

Per cached MoE layer there are ``hpc_slots + mpc_slots`` slots. The HPC holds the layer's ``hpc_slots`` hottest
experts (from the hot-expert profile) for the whole run. At the start of each batch the MPC is filled with the
next ``mpc_slots`` hot experts, and those ``hpc_slots + mpc_slots`` experts start at score ``max_val``; every
other expert starts at 0.

Each iteration in which the layer runs, after its gate:

1. every active expert gains 1 (capped at ``max_val``);
2. every inactive expert decays by ``dec_in_cache`` if it is cached (HPC or MPC) or ``dec_out_cache`` if not
   (floored at 0);
3. MPC replacement: the active experts sorted by score, highest first (ties: lower id first), are walked
   against the MPC slots sorted by score, weakest first (ties: longest held first). The walk stops when the
   weakest remaining slot's score is >= ``threshold`` or the next candidate's is < ``threshold``; a candidate
   already cached is skipped without using up the slot; otherwise the candidate takes the slot. A promoted
   expert is copied device-to-device from its working buffer (no second PCIe transfer).

Misses and prefetched experts use the shared working buffers (the LPC) and are dropped after use unless promoted.
With ``hit_d2d`` (the artifact's behaviour), a cached expert is also copied device-to-device into the layer's
working arena before it computes.

Deviation from the artifact, on purpose: the artifact's cached/uncached test compares slot ids with expert ids,
which is wrong for layers above 0; this module uses the intended rule (cached = held in the layer's HPC or MPC).
Layers that are not cached (``cache.layers``) fetch on demand and keep no scores.
"""

from __future__ import annotations

import numpy as np

from sim.policies.base import POLICIES, LayerPlan, Policy


@POLICIES.register("diffmoe")
class DiffMoE(Policy):
    PARAMS = {"max_val": 2.0, "dec_in_cache": 0.4, "dec_out_cache": 0.2, "threshold": 1.0, "hit_d2d": True,
              "reset_per_batch": True}

    def configure(self) -> None:
        p = self.params
        for name in ("max_val", "dec_in_cache", "dec_out_cache", "threshold"):
            if p[name] < 0:
                from sim.errors import ConfigError

                raise ConfigError(f"policy.params.{name}: must be >= 0, got {p[name]}")
        self.hit_d2d = bool(p["hit_d2d"])
        self.scores = np.zeros((self.ctx.num_layers, self.ctx.num_experts))
        self.pin_hot_experts()
        self._started = False

    def start_batch(self) -> None:
        if self._started and not self.params["reset_per_batch"]:
            return
        self._started = True
        h, m = self.cache.hpc_slots, self.cache.mpc_slots
        self.scores[:] = 0.0
        for layer in self.ctx.cached_layers:
            hot = self.ctx.hot_ranking[layer][: h + m]
            self.cache.fill_mpc(layer, hot[h:])
            self.scores[layer, list(hot)] = self.params["max_val"]
        # per layer, each expert's decay when inactive: dec_in_cache where cached (HPC or MPC), else dec_out_cache
        self.decay = np.full((self.ctx.num_layers, self.ctx.num_experts), self.params["dec_out_cache"])
        for layer in self.ctx.cached_layers:
            held = list(self.cache.hpc[layer]) + list(self.cache.mpc[layer])
            self.decay[layer, held] = self.params["dec_in_cache"]

    def update(self, iteration, layer, active, plan: LayerPlan) -> None:
        if layer not in self.ctx.cached_layers:
            return
        p, cache = self.params, self.cache
        score = self.scores[layer]
        gained = np.minimum(score[list(active)] + 1.0, p["max_val"])  # 1. active experts gain 1, capped
        score -= self.decay[layer]  # 2. inactive ones decay (by whether they are cached)
        np.maximum(score, 0.0, out=score)
        score[list(active)] = gained
        hpc, mpc = cache.hpc[layer], cache.mpc[layer]
        newcomers = [e for e in active if e not in hpc and e not in mpc]
        if not newcomers:
            return  # 3. nothing to promote: every active expert is cached already
        sc = score.tolist()
        threshold = p["threshold"]
        # candidates by score, highest first (ties: lower id, as ``active`` is sorted); cached ones are skipped
        # without using a slot, so only the uncached ones matter for the walk
        candidates = sorted(newcomers, key=lambda e: -sc[e])
        # weakest first; an empty slot counts as score 0; an expert in use now is never a victim
        active_set = set(active)
        held = sorted((e for e in mpc if e not in active_set), key=sc.__getitem__)
        slots = [None] * (cache.mpc_slots - len(mpc)) + held
        for j, c in enumerate(candidates):
            if j >= len(slots) or sc[c] < threshold:
                break
            victim = slots[j]
            if victim is not None and sc[victim] >= threshold:
                break
            cache.promote(layer, c, victim)
            plan.promote[c] = victim
            self.decay[layer, c] = p["dec_in_cache"]
            if victim is not None:
                self.decay[layer, victim] = p["dec_out_cache"]
