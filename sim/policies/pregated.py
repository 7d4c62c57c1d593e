"""`pregated` (Pre-gated MoE, ISCA 2024): the pre-gate in layer l selects layer l+1's experts, which are copied
during layer l's compute; nothing is kept across iterations.

- Prefetch: exactly the configured predictor's guess for the next layer (the base class's ``plan_prefetch``);
  with the ``oracle`` predictor this is an exact pre-gate, with ``noisy`` a pre-gate of the given recall and
  precision, with ``none`` no prefetch at all (then it is on-demand).
- Mispredicted experts (active but not prefetched) are demand misses; prefetched experts that go unused are
  dropped by the engine. The first MoE layer of an iteration has no pre-gate before it, so it fetches on demand.
- Double buffering (the current layer's experts in one buffer while the next layer's land in the other) is the
  engine's working-buffer pool (``cache.lpc_buffers``, two layers' worth reproduces the paper); the policy keeps
  no HPC or MPC (capacity 0, like on-demand), whatever the configured slots say.
"""

from __future__ import annotations

from sim.policies.base import POLICIES, KeepNothing


@POLICIES.register("pregated")
class PreGated(KeepNothing):
    """Prefetch the predicted next-layer experts into working buffers; cache nothing."""

    origin = "baseline"
    default_predictor = "oracle"
