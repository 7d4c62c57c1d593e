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

Ties: the expert held longest goes first. EAMs come from ``sim/moe_infinity.py``: the current iteration's routing
of a layer is read only once its gate has run; the collection of finished requests' EAMs holds at most
``capacity`` (FIFO). Layers that are not cached fetch on demand and keep nothing.
"""

from __future__ import annotations

import numpy as np

from sim.cache import LPC, MISS
from sim.errors import ConfigError
from sim.moe_infinity import ActivationTracker
from sim.params import between, one_of
from sim.policies.base import POLICIES, LayerPlan, Policy, PolicyContext

ACTIVATION = ("mix", "eam", "own")
FLOOR = 1e-6


@POLICIES.register("moe-infinity")
class MoEInfinity(Policy):
    PARAMS = {"pin_hot": False, "capacity": 256, "activation": "mix"}
    # capacity: EAMs kept, each a [layers, experts] float array (twice): bounded so that it cannot exhaust memory
    PARAM_RULES = {"capacity": between(1, 1 << 14), "activation": one_of(*ACTIVATION)}
    promotion_is_free = True  # the copy lands in the slot it will occupy

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
            raise ConfigError("policy.params.activation", f"must be one of {', '.join(ACTIVATION)}, "
                                                          f"got {p['activation']!r}")
        trace = self.ctx.extra.get("trace")
        if trace is None:
            raise ValueError("policy 'moe-infinity' needs the workload's trace in its context "
                             "(PolicyContext.extra['trace'])")
        self.tracker = ActivationTracker(trace, cap)
        if p["pin_hot"]:
            self.pin_hot_experts()

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

    def update(self, iteration, layer, active, plan: LayerPlan) -> None:
        self.tracker.observe_through(layer)  # this layer's gate has run
        if layer not in self.ctx.cached_layers or self.cache.mpc_slots == 0:
            return
        newcomers = [e for e in active if plan.sources[e] in (MISS, LPC)]
        if not newcomers:
            return
        prio = self.priority(layer).tolist()
        mpc = self.cache.mpc[layer]
        active_set = set(active)
        for e in sorted(newcomers, key=lambda x: (-prio[x], x)):
            victim = None
            if len(mpc) >= self.cache.mpc_slots:
                held = [v for v in mpc if v not in active_set]  # longest held first
                if not held:
                    break  # every slot holds an expert this layer uses now
                victim = min(held, key=prio.__getitem__)
            self.cache.promote(layer, e, victim)
            plan.promote[e] = victim
