"""`gpu-only`: every expert resident on the GPU (the ceiling no offloading policy can beat)."""

from __future__ import annotations

import dataclasses

from sim.policies.base import POLICIES, Policy, PolicyContext


@POLICIES.register("gpu-only")
class GpuOnly(Policy):
    """All experts of every layer sit in the HPC; nothing is ever copied."""

    origin = "ceiling"

    all_resident = True
    uses_predictor = False  # nothing to prefetch
    supports_shared = True  # everything resident: the organization of the slots does not matter
    keeps_mpc = False

    def hpc_capacity(self, ctx: PolicyContext) -> int:
        return ctx.num_experts

    def mpc_capacity(self, ctx: PolicyContext) -> int:
        return 0

    def __init__(self, params, ctx: PolicyContext, where: str = "policy.params"):
        ctx = dataclasses.replace(ctx, cached_layers=frozenset(range(ctx.num_layers)))
        super().__init__(params, ctx, where)

    def configure(self) -> None:
        for layer in range(self.ctx.num_layers):
            self.cache.pin_hpc(layer, range(self.ctx.num_experts))

    def plan_prefetch(self, iteration, layer, predicted):
        return []
