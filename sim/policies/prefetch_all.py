"""`prefetch-all` (SE-MoE): during layer l, copy every expert of layer l+1 that is not already on the GPU.

The predictor's guess is ignored (the engine asks ``plan_prefetch`` at every gate, with the guess or an empty
one). Nothing is kept across iterations (HPC and MPC capacity 0), so every expert of the next layer is copied,
in id order; the ones the layer does not use are dropped by the engine (cancelled if their copy has not
started). The first MoE layer of an iteration has no layer before it, so it fetches on demand.
"""

from __future__ import annotations

from sim.policies.base import POLICIES, KeepNothing


@POLICIES.register("prefetch-all")
class PrefetchAll(KeepNothing):
    """Prefetch all of the next layer's uncached experts; cache nothing."""

    origin = "baseline"
    uses_predictor = False  # it prefetches every expert, whatever the guess

    def plan_prefetch(self, iteration, layer, predicted):
        return super().plan_prefetch(iteration, layer, range(self.ctx.num_experts))
