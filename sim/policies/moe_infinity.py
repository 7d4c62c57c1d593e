"""`moe-infinity`: MoE-Infinity's activation-aware expert cache (Xue et al. 2024; ``TorchMoE/MoE-Infinity``,
``moe_infinity/memory/expert_priority_score.py``), on per-layer slots.

Tiers: per cached MoE layer, an MPC of ``mpc_slots`` experts; with ``pin_hot`` the layer's ``hpc_slots`` hottest
experts are pinned in the HPC, without it (the default: MoE-Infinity pins nothing) the HPC slots join the MPC, so
the same GPU memory holds ``hpc_slots + mpc_slots`` cached experts per layer.

Prefetch: the predictor's guess for the next layer (the base class), i.e. with the `moe-infinity` predictor the
experts the matched Expert Activation Matrices rank highest. Copies land in their cache slot (as in the artifact,
whose cache is where a fetched expert lives), so promotion costs no device-to-device copy.

Replacement: every expert copied for a layer (a miss, or a used prefetch) enters the layer's MPC, the
highest-priority newcomer first, evicting the MPC expert of lowest priority that the layer does not use now (never
an active one; if every slot holds an active expert the newcomer is dropped after use). Priority of expert ``e`` of
layer ``j`` when layer ``l`` runs:

    activation(e) x frequency(e) x proximity(j, l)

- activation: the current requests' predicted use of ``e`` in ``j``, summed over the requests: with ``activation:
  mix`` (default) the mean of the matched stored EAM's row ``j`` and the request's own row ``j`` so far (each as a
  distribution; the own row alone where nothing matches); ``eam`` the matched row only (own row where unmatched),
  ``own`` the own row only (the artifact's cache uses the sequence's own matrix). A small floor (1e-6) keeps
  experts with no predicted use ordered by frequency.
- frequency: ``e``'s share of layer ``j``'s selections since the run started (Laplace-smoothed, never 0);
- proximity: in MoE-Infinity's whole-model cache an expert of a layer closer ahead of the running one ranks higher
  (``1 - (j - l) / (L + 1)``); slots here are per layer and a victim is always taken from the running layer's own
  MPC, so ``j = l`` and the factor is 1 for every candidate.

Ties: the expert held longest goes first.

**Shared cache** (``cache.organization: shared``; MoE-Infinity's own design is one cache for the whole model): the
cache holds ``shared_slots`` experts of any cached layers (default ``(hpc_slots + mpc_slots) x cached layers``, the
same memory), and the victim is the expert of lowest priority among every cached layer's experts but those the
running layer uses now, with the proximity factor ``1 - d / (L + 1)``, ``d`` the layers between the running layer
``l`` and the next run of ``j`` (``d = 0`` for the next layer, ``L - 1`` for ``l`` itself, which has just run: its
next use is a whole pass away; ``L`` the cached layers). How the artifact counts ``d`` for layers behind the running
one is **guessed** (here: the distance to their next run, wrapping to the next iteration). Ties: the expert held
longest (over all layers) goes first.

EAMs come from ``sim/core/expert_activation.py``: the current iteration's routing
of a layer is read only once its gate has run; the collection of finished requests' EAMs holds at most
``capacity`` (FIFO). Layers that are not cached fetch on demand and keep nothing.
"""

from __future__ import annotations

import numpy as np

from moebase.errors import ConfigError
from sim.config.params import between, one_of
from sim.core.expert_activation import ActivationTracker
from sim.policies.base import POLICIES, LayerPlan, Policy, PolicyContext

ACTIVATION = ("mix", "eam", "own")
FLOOR = 1e-6


@POLICIES.register("moe-infinity")
class MoEInfinity(Policy):
    origin = "published"
    default_predictor = "moe-infinity"
    PARAMS = {"pin_hot": False, "capacity": 256, "activation": "mix"}
    # capacity: EAMs kept, each a [layers, experts] float array (twice): bounded so that it cannot exhaust memory
    PARAM_RULES = {"capacity": between(1, 1 << 14), "activation": one_of(*ACTIVATION)}
    promotion_is_free = True  # the copy lands in the slot it will occupy
    supports_shared = True
    admits = "rank"
    observes_every_layer = True  # the tracker hears of every gate

    def hpc_capacity(self, ctx: PolicyContext) -> int:
        return ctx.hpc_slots if self.params["pin_hot"] else 0

    def mpc_capacity(self, ctx: PolicyContext) -> int:
        return ctx.mpc_slots + (0 if self.params["pin_hot"] else ctx.hpc_slots)

    def configure(self) -> None:
        p = self.params
        cap = p["capacity"]
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ConfigError("policy.params.capacity", f"must be an integer >= 1, got {cap!r}")
        if p["activation"] not in ACTIVATION:
            raise ConfigError(
                "policy.params.activation", f"must be one of {', '.join(ACTIVATION)}, got {p['activation']!r}"
            )
        trace = self.ctx.trace
        if trace is None:
            raise ValueError("policy 'moe-infinity' needs the workload's trace in its context (PolicyContext.trace)")
        self.tracker = ActivationTracker(trace, cap)
        if p["pin_hot"]:
            self.pin_hot_experts()
        if self.shared:
            self.since: dict[tuple[int, int], int] = {}  # (layer, expert) -> when it entered the shared MPC
            self.clock = 0

    def start_iteration(self, iteration) -> None:
        self.tracker.start_iteration(iteration)

    def plan_prefetch(self, iteration, layer, predicted):
        self.tracker.observe_before(layer)  # the gate before ``layer`` has run
        return super().plan_prefetch(iteration, layer, predicted)

    def activation(self, layer: int) -> np.ndarray:
        """[experts]: the current requests' predicted use of ``layer``'s experts."""
        t = self.tracker
        own = t.own_rows(layer)
        how = self.params["activation"]
        if how == "own":
            rows = own
        else:
            matched, ok = t.matched_rows(layer)
            rows = np.where(ok[:, None], matched, own)
            if how == "mix":
                rows = np.where(ok[:, None], 0.5 * (matched + own), own)
        return rows.sum(axis=0)

    def priority(self, layer: int) -> np.ndarray:
        """[experts]: eviction priority in ``layer``'s own MPC (layer proximity 1)."""
        return (self.activation(layer) + FLOOR) * self.tracker.frequency(layer)

    def priority_all(self) -> np.ndarray:
        """[layers, experts]: :meth:`priority` of every layer at once (the same arithmetic, one numpy pass)."""
        t = self.tracker
        m = t.matrices  # [R, layers, experts]
        s = m.sum(axis=-1, keepdims=True)
        own = np.divide(m, s, out=np.zeros_like(m, dtype=np.float64), where=s > 0)
        how = self.params["activation"]
        if how == "own":
            rows = own
        else:
            best = t.matches()
            ok = best >= 0
            matched = np.zeros_like(own)
            if ok.any():
                c = t.collection.counts[best[ok]]
                cs = c.sum(axis=-1, keepdims=True)
                matched[ok] = np.divide(c, cs, out=np.zeros_like(c, dtype=np.float64), where=cs > 0)
            okb = ok[:, None, None]
            rows = np.where(okb, 0.5 * (matched + own), own) if how == "mix" else np.where(okb, matched, own)
        g = t.global_counts
        freq = (g + 1.0) / (g.sum(axis=1, keepdims=True) + g.shape[1])
        return (rows.sum(axis=0) + FLOOR) * freq

    def observe(self, iteration, layer: int, active, plan: LayerPlan) -> None:
        """Tell the tracker ``layer``'s gate has run (every layer, cached or not)."""
        self.tracker.observe_through(layer)

    def victim_key(self, layer: int, active, newcomers: list[int]):
        """The highest-priority newcomer first (ties: lower id); the victim is the lowest priority (ties: the
        expert held longest)."""
        prio = self.priority(layer).tolist()
        newcomers.sort(key=lambda x: (-prio[x], x))
        return lambda v: -prio[v]

    def shared_victim_keys(self, layer: int, active, newcomers: list[int]):
        """The lowest priority over every cached layer, with the layer-proximity factor (ties: held longest)."""
        prio = self.priority_all()
        own = prio[layer].tolist()
        newcomers.sort(key=lambda x: (-own[x], x))
        n = len(self.layer_pos)
        since, until = self.since, self.layers_until

        def keys(j, held):
            row = own if j == layer else prio[j].tolist()
            proximity = 1.0 - (until(j, layer) - 1) / (n + 1)
            return [(-(row[v] * proximity), -since[(j, v)]) for v in held]

        return keys

    def after_admission(self, layer: int, newcomers: list[int], plan: LayerPlan) -> None:
        """Shared cache: stamp when each admitted expert entered (the ties' "held longest")."""
        if not self.shared:
            return
        since = self.since
        for e, victim in plan.promote.items():
            if victim is not None:
                del since[victim]
            self.clock += 1
            since[(layer, e)] = self.clock
