"""`on-demand` ("DeepSpeed" in the Diff-MoE and Pre-gated evaluations): after the gate, copy the layer's
active experts, wait, compute; nothing is kept across iterations and nothing is prefetched."""

from __future__ import annotations

from sim.policies.base import POLICIES, KeepNothing


@POLICIES.register("on-demand")
class OnDemand(KeepNothing):
    """Every access is a miss copied into a working buffer and dropped after use."""

    origin = "baseline"
    uses_predictor = False

    def plan_prefetch(self, iteration, layer, predicted):
        return []
