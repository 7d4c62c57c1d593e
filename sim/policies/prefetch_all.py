"""`prefetch-all` (SE-MoE): during layer l, copy every expert of layer l+1 that is not already on the GPU.

The predictor's guess is ignored (the engine asks ``plan_prefetch`` at every gate, with the guess or an empty
one). Nothing is kept across iterations (HPC and MPC capacity 0), so every expert of the next layer is copied,
in id order; the ones the layer does not use are dropped by the engine (cancelled if their copy has not
started). The first MoE layer of an iteration has no layer before it, so it fetches on demand.
"""

from __future__ import annotations

from sim.policies.base import POLICIES, Policy, PolicyContext


@POLICIES.register("prefetch-all")
class PrefetchAll(Policy):
    """Prefetch all of the next layer's uncached experts; cache nothing."""

    def hpc_capacity(self, ctx: PolicyContext) -> int:
        return 0

    def mpc_capacity(self, ctx: PolicyContext) -> int:
        return 0

    def plan_prefetch(self, iteration, layer, predicted):
        cache = self.cache
        hpc, mpc, lpc = cache.hpc[layer], cache.mpc[layer], cache.lpc
        out = [e for e in range(self.ctx.num_experts) if e not in hpc and e not in mpc and (layer, e) not in lpc]
        for e in out:
            cache.add_lpc(layer, e)
        return out
