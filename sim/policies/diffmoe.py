"""`diffmoe`: Diff-MoE's priority-driven differential expert caching (SC 2025), as its artifact runs it
(``ceciliawinter/Diff-MoE``, ``src/fastertransformer/utils/fetcher.cc``, ``FetcherContext::fetch``, cache
policy 0); docs/architecture.md 5.4 states the rules, docs/diffmoe_artifact.md walks through the code.

State per cached MoE layer: a score per expert and a *slot array* of ``hpc_slots + mpc_slots`` experts, as the
artifact's ``expert_in_cache`` row: the first ``hpc_slots`` are the HPC (never replaced), the rest the MPC.

**Start of a batch** (each static batch; ``reset_per_batch: false`` keeps the state across batches): with
``fill: hot`` (default) the slots hold the layer's ``hpc_slots + mpc_slots`` hottest experts (``cache.hot_profile``,
in ranking order) and those start at ``max_val``; with ``fill: expert0`` every slot holds expert 0 (what the
artifact does when the model has no hot-expert list, as for the base switch-base-128: its scripts then pass a list
of zeros), and only expert 0 starts at ``max_val``. Every other expert starts at 0. (The ranking is
``ctx.hot_ranking``, built by ``sim.decisions.build.hot_ranking`` from ``cache.hot_profile``: the run's own trace by
default, a profiling trace, or explicit per-layer lists, which are padded with the other experts by id and so
cannot say "expert 0 everywhere": that is what ``fill: expert0`` is for.)

**Each iteration in which the layer runs**, after its gate (the active experts in ascending id order, as the
artifact's ``std::unique`` over the sorted ``permuted_experts_`` leaves them):

1. every active expert gains 1, capped at ``max_val``;
2. every inactive expert decays by ``dec_in_cache`` if it is cached (in the slot array) or ``dec_out_cache`` if
   not. Scores are **not floored at 0** (``floor: false``, the artifact): an idle expert goes negative and then
   needs several activations to reach the threshold. ``floor: true`` floors decayed scores at 0 (this simulator's
   earlier rule: an idle expert's first activation reaches 1.0 and can be promoted at once);
3. MPC replacement (``victim_order: artifact``): the active experts are sorted by score, highest first, and the
   MPC part of the slot array is re-sorted in place by score, highest first, both with ``std::sort`` (exactly as
   libstdc++ does it, :mod:`sim.policies._libstdcxx`: stable for at most 16 elements, introsort above). The walk
   takes MPC slots from the array's end (so the weakest slot first; among equal scores the one *latest in the
   array*, i.e. the last of the tied run after the stable re-sort, which keeps the previous order) and candidates
   from the front: it stops when the slot's score is >= ``threshold`` or the candidate's is < ``threshold``; a
   candidate already cached is skipped without using up the slot; otherwise the candidate takes the slot (its
   position in the array). An expert active now may be evicted (its score is then below the threshold); it has
   already been read for this layer. The re-sorted array order persists to the next iteration.
   ``victim_order: legacy`` is this simulator's earlier rule: candidates by score (ties: lower id),
   victims among the MPC experts *not* active now, weakest first (ties: longest held first).

**Arithmetic** (``arithmetic``): ``exact`` (default) keeps scores in integer millionths, so that 1.8 - 0.4 - 0.4
is 1.0 and reaches a threshold of 1.0 (params need at most 6 decimals); ``float32`` reproduces the artifact's
``float`` scores bit for bit, drift included (there, with both decays 0.2, 2.0 - 5 x 0.2 is 0.9999998 and falls
below the threshold); ``float64`` reproduces this simulator's earlier arithmetic (Python floats: 1.8 - 0.4 - 0.4 is
0.9999999999999999).

**Cached-or-not test** for the decay (``in_cache_check``): ``intended`` (default, docs/architecture.md 5.4) = held in
the layer's slot array. ``artifact`` = the artifact's comparison of slot contents with ``layer * 128 + expert``, true
only in the first cached layer: in every other cached layer every idle expert decays by ``dec_out_cache``.

Tiers and copies: a promoted expert moves from its working buffer into the MPC by a device-to-device copy (no
second PCIe transfer); the artifact's copy runs the other way, slot to buffer (a correctness bug with no timing
effect: the same bytes cross HBM). With ``hit_d2d`` (default, the artifact) a cached expert is copied
device-to-device into the layer's working arena before it computes. Misses and prefetched experts use the shared
working buffers (the LPC) and are dropped after the layer unless promoted. Layers not cached (``cache.layers``)
fetch on demand and keep no scores.

What the artifact's measured runs did, beyond this module (docs/diffmoe_artifact.md): they decode greedily, beam
1 (the scripts pass ``--beam_width 4`` but select the sampling path, which sets beam 1); the prefetch of layer
l+1 (``decoder_fetcher_mode`` 2) fetches and scores the ids layer l's gate chose, so cached layer l+1's cache is
driven by layer l's routing (the first MoE layer's ids drive both cached layer 0, by its own fetch, and cached
layer 1); the scores index experts as ``layer * 128 + id`` and the decay loop runs over 128 experts whatever the
model has, so only 128-expert models run as intended.

**Per-layer by design**: Diff-MoE's slot array, scores and threshold walk are per layer, so the policy refuses
``cache.organization: shared`` (as ``diffmoe-arc`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from moebase.errors import ConfigError
from sim.config.params import between, one_of
from sim.policies._libstdcxx import sort_by_key_descending
from sim.policies.base import POLICIES, LayerPlan, Policy

#: Score units per 1.0 with ``arithmetic: exact``.
EXACT_SCALE = 10**6

CHOICES = {
    "victim_order": ("artifact", "legacy"),
    "arithmetic": ("exact", "float32", "float64"),
    "fill": ("hot", "expert0"),
    "in_cache_check": ("intended", "artifact"),
}
NUMBERS = ("max_val", "dec_in_cache", "dec_out_cache", "threshold")


@POLICIES.register("diffmoe")
class DiffMoE(Policy):
    origin = "published"
    default_predictor = "oracle"
    admits = "rule"  # the slot array's threshold walk (its victims may be active now)
    observes_every_layer = True  # scores move on every cached layer, an MPC of no slots included
    PARAMS = {
        "max_val": 2.0,
        "dec_in_cache": 0.4,
        "dec_out_cache": 0.2,
        "threshold": 1.0,
        "hit_d2d": True,
        "reset_per_batch": True,
        "floor": False,
        "victim_order": "artifact",
        "arithmetic": "exact",
        "fill": "hot",
        "in_cache_check": "intended",
    }
    PARAM_RULES = {
        **{name: one_of(*choices) for name, choices in CHOICES.items()},
        **{name: between(0.0, 1e6) for name in NUMBERS},
    }  # scores: finite, exact in int64 units

    @classmethod
    def validate_params(cls, params: dict, where: str) -> None:
        """``fill: expert0`` needs the artifact's victim order; exact arithmetic needs at most 6 decimals."""
        if params["fill"] == "expert0" and params["victim_order"] != "artifact":
            raise ConfigError(f"{where}.fill", "expert0 (every slot holds expert 0) needs victim_order: artifact")
        if params["arithmetic"] == "exact":
            for name in NUMBERS:
                units = params[name] * EXACT_SCALE
                if abs(units - round(units)) > 1e-6 * max(1.0, abs(units)):
                    raise ConfigError(
                        f"{where}.{name}",
                        f"must have at most 6 decimals with arithmetic: exact, got "
                        f"{params[name]!r} (or set arithmetic: float32)",
                    )

    def configure(self) -> None:
        p = self.params
        where = "policy.params"
        for name, choices in CHOICES.items():
            if p[name] not in choices:
                raise ConfigError(f"{where}.{name}", f"must be one of {', '.join(choices)}, got {p[name]!r}")
        for name in NUMBERS:
            v = p[name]
            if not np.isfinite(v) or v < 0:
                raise ConfigError(f"{where}.{name}", f"must be a finite number >= 0, got {v!r}")
        if p["fill"] == "expert0" and p["victim_order"] != "artifact":
            raise ConfigError(f"{where}.fill", "expert0 (every slot holds expert 0) needs victim_order: artifact")
        arith = p["arithmetic"]
        # Scores are plain Python numbers, one list per layer (a layer has tens to hundreds of experts: numpy's
        # per-call cost outweighs its loops): ints in millionths (exact), floats (float64), or numpy float32
        # scalars (float32: each operation rounds to float32 as the artifact's floats do).
        if arith == "exact":
            self._dtype: Any = np.int64
            for name in NUMBERS:
                units = p[name] * EXACT_SCALE
                if abs(units - round(units)) > 1e-6 * max(1.0, abs(units)):
                    raise ConfigError(
                        f"{where}.{name}",
                        f"must have at most 6 decimals with arithmetic: exact, got "
                        f"{p[name]!r} (or set arithmetic: float32)",
                    )
            conv: Callable[[float], Any] = lambda v: int(round(v * EXACT_SCALE))  # noqa: E731
        elif arith == "float32":
            self._dtype = conv = np.float32
        else:
            self._dtype, conv = np.float64, float
        self._one = conv(1.0)
        self._max, self._thr = conv(p["max_val"]), conv(p["threshold"])
        self._dec_in, self._dec_out = conv(p["dec_in_cache"]), conv(p["dec_out_cache"])
        self._zero = conv(0.0)
        self.hit_d2d = bool(p["hit_d2d"])
        n, e = self.ctx.num_layers, self.ctx.num_experts
        self._s: list[list] = [[self._zero] * e for _ in range(n)]
        #: exact integers without a floor: every expert's decay by ``dec_out_cache`` is one step of the layer's
        #: offset, ``_off[layer]``, and a score is ``_s[layer][x] - _off[layer]`` (the few held experts take the
        #: rest of their decay in ``_s``); else the offsets stay 0 and ``_s`` holds the scores
        self._lazy = self._dtype is np.int64 and not p["floor"]
        self._off: list[int] = [0] * n
        self.held: list[list[bool]] = [[False] * e for _ in range(n)]  # in the layer's slot array (HPC or MPC)
        self.slots: list[list[int]] = [[] for _ in range(n)]  # the MPC part of the slot array, in array order
        self._first_cached = min(self.ctx.cached_layers) if self.ctx.cached_layers else -1
        #: per layer, the held experts' decay beyond the offset's step (``_decay_held``'s rule)
        extra = self._dec_in - self._dec_out
        self._held_extra = [
            extra if p["in_cache_check"] == "intended" or layer == self._first_cached else 0 for layer in range(n)
        ]
        if p["fill"] == "expert0":
            for layer in self.ctx.cached_layers:
                self.cache.pin_hpc(layer, [0] if self.cache.hpc_slots else [])
        else:
            self.pin_hot_experts()
        self._started = False

    @property
    def scores(self) -> np.ndarray:
        """Scores per (layer, expert), in score units (a float copy)."""
        if self._dtype is np.int64:
            s = np.array(self._s, dtype=np.int64) - np.array(self._off, dtype=np.int64)[:, None]
            return s / EXACT_SCALE
        return np.array(self._s, dtype=self._dtype).astype(np.float64)

    def start_batch(self) -> None:
        if self._started and not self.params["reset_per_batch"]:
            return
        self._started = True
        cache = self.cache
        h, m = cache.hpc_slots, cache.mpc_slots
        n, e = self.ctx.num_layers, self.ctx.num_experts
        self._s = [[self._zero] * e for _ in range(n)]
        self._off = [0] * n
        self.held = [[False] * e for _ in range(n)]
        for layer in self.ctx.cached_layers:
            hpc = cache.hpc[layer]
            if self.params["fill"] == "expert0":
                slots = [0] * m
                start = [0] if h + m else []
            else:
                hot = list(self.ctx.hot_ranking[layer][: h + m])
                slots, start = hot[h:], hot
            self.slots[layer] = slots
            cache.fill_mpc(layer, [e for e in dict.fromkeys(slots) if e not in hpc])
            s, held = self._s[layer], self.held[layer]
            for x in start:
                s[x] = self._max
            for x in (*hpc, *slots):
                held[x] = True

    def observe(self, iteration, layer: int, active, plan: LayerPlan) -> None:
        """Steps 1 and 2 on a cached layer: the active experts gain, the others decay."""
        if layer not in self.ctx.cached_layers:
            return
        s = self._s[layer]
        one, top = self._one, self._max
        if self._lazy:
            self._observe_lazy(layer, s, active, plan.sources)
            return
        # 1. active experts gain 1, capped at max_val
        gained = [min(s[a] + one, top) for a in active]
        # 2. inactive ones decay by whether they are cached (state before this step's replacements)
        s = self._s[layer] = self._decayed(layer, s)
        for a, g in zip(active, gained):
            s[a] = g

    def _observe_lazy(self, layer: int, s: list, active, sources: dict) -> None:
        """Steps 1 and 2 with the common decay in the layer's offset (``_lazy``): each active expert's gain (from
        its score before the step), the offset's step, then the rest of the decay of the held experts not active
        (``sources``: the active ones), whose scores the gain does not replace."""
        off = self._off[layer]
        new_off = self._off[layer] = off + self._dec_out
        one, top = self._one, self._max
        for a in active:
            s[a] = min(s[a] - off + one, top) + new_off
        extra = self._held_extra[layer]
        if extra:
            cache = self.cache
            for x in cache.hpc[layer]:
                if x not in sources:
                    s[x] -= extra
            for x in cache.mpc[layer]:
                if x not in sources:
                    s[x] -= extra

    def _decayed(self, layer: int, s: list) -> list:
        """Every score of ``layer`` decayed: by ``dec_in_cache`` if its expert is held in the slot array (as
        ``in_cache_check`` tests it), else by ``dec_out_cache``; floored at 0 with ``floor``. (With exact integers
        and no floor, ``observe`` keeps the decay in the layer's offset instead, ``_observe_lazy``; this eager form
        is what tests/sim/policies/test_diffmoe_lazy_decay.py compares it with.)"""
        d_in, d_out = self._dec_in, self._dec_out
        by_held = self.params["in_cache_check"] == "intended" or layer == self._first_cached
        if self._dtype is np.int64 and not self.params["floor"]:
            # exact integers: v - d_in is (v - d_out) - (d_in - d_out), so only the few held experts take a second
            # step: those ``held`` marks, the layer's HPC and MPC (the slots' experts; the two are disjoint)
            s = [v - d_out for v in s]
            self._decay_held(layer, s)
            return s
        if by_held:
            s = [v - d_in if h else v - d_out for v, h in zip(s, self.held[layer])]
        else:
            s = [v - d_out for v in s]
        if self.params["floor"]:
            zero = self._zero
            s = [v if v > zero else zero for v in s]
        return s

    def _decay_held(self, layer: int, s: list) -> None:
        """Exact integers: the held experts' decay beyond ``dec_out_cache`` (by ``in_cache_check``), in place: those
        of the layer's HPC and MPC (the slots' experts; the two are disjoint)."""
        d_in, d_out = self._dec_in, self._dec_out
        if d_in != d_out and (self.params["in_cache_check"] == "intended" or layer == self._first_cached):
            extra = d_in - d_out
            for tier in (self.cache.hpc[layer], self.cache.mpc[layer]):
                for x in tier:
                    s[x] -= extra

    def _threshold(self, layer: int):
        """``threshold`` in the units of ``_s[layer]`` (the layer's offset added)."""
        return self._thr + self._off[layer] if self._lazy else self._thr

    # ---------------------------------------------------------------------------------------------- replacement
    def choose(self, iteration, layer: int, active, plan: LayerPlan) -> list[tuple[int, int | None]]:
        """Step 3, the MPC replacement, by ``victim_order``: the (newcomer, victim) promotions."""
        if self.params["victim_order"] == "artifact":
            return self._replace_artifact(layer, list(active))
        return self._replace_legacy(layer, list(active))

    def _replace_artifact(self, layer: int, active: list[int]) -> list[tuple[int, int | None]]:
        slots = self.slots[layer]
        m = len(slots)
        out: list[tuple[int, int | None]] = []
        if m == 0:
            return out
        sc = self._s[layer]
        thr = self._threshold(layer)
        candidates = list(active)  # ascending ids: std::unique over the sorted permuted experts
        sort_by_key_descending(candidates, sc)  # std::sort(expert_pairs_using, priority >)
        sort_by_key_descending(slots, sc)  # std::sort(MPC part of expert_in_cache, priority >), in place
        hpc, held = self.cache.hpc[layer], self.held[layer]
        i = j = 0
        while i < m and j < len(candidates):
            pos = m - 1 - i
            if sc[slots[pos]] >= thr:
                break
            c = candidates[j]
            if sc[c] < thr:
                break
            if c in hpc or c in slots:  # already cached: skipped, the slot stays for the next one
                j += 1
                continue
            old = slots[pos]
            slots[pos] = c
            still = old in hpc or old in slots  # expert 0 may fill several slots (fill: expert0)
            out.append((c, None if still else old))
            held[c] = True
            held[old] = still
            i += 1
            j += 1
        return out

    def _replace_legacy(self, layer: int, active: list[int]) -> list[tuple[int, int | None]]:
        cache = self.cache
        hpc, mpc = cache.hpc[layer], cache.mpc[layer]
        newcomers = [e for e in active if e not in hpc and e not in mpc]
        out: list[tuple[int, int | None]] = []
        if not newcomers:
            return out
        sc = self._s[layer]
        thr = self._threshold(layer)
        candidates = sorted(newcomers, key=sc.__getitem__, reverse=True)  # stable: ties keep lower id first
        active_set = set(active)
        held = sorted((e for e in mpc if e not in active_set), key=sc.__getitem__)  # ties: longest held first
        order = [None] * (cache.mpc_slots - len(mpc)) + held  # an empty slot counts as score 0, first
        slots = self.slots[layer]
        for j, c in enumerate(candidates):
            if j >= len(order) or sc[c] < thr:
                break
            victim = order[j]
            if victim is not None and sc[victim] >= thr:
                break
            out.append((c, victim))
            self.held[layer][c] = True
            if victim is None:
                slots.append(c)
            else:
                slots[slots.index(victim)] = c
                self.held[layer][victim] = False
        return out
