"""`on-demand` ("DeepSpeed" in the Diff-MoE and Pre-gated evaluations): after the gate, copy the layer's
active experts, wait, compute; nothing is kept across iterations and nothing is prefetched."""

from __future__ import annotations

from sim.policies.base import Policy, PolicyContext
from sim.policies.base import POLICIES


@POLICIES.register("on-demand")
class OnDemand(Policy):
    """Every access is a miss copied into a working buffer and dropped after use."""

    def hpc_capacity(self, ctx: PolicyContext) -> int:
        return 0

    def mpc_capacity(self, ctx: PolicyContext) -> int:
        return 0

    def plan_prefetch(self, iteration, layer, predicted):
        return []
