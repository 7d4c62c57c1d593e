"""`fiddler` (Kamahori et al., "Fiddler: CPU-GPU Orchestration for Fast Inference of Mixture-of-Experts Models",
ICLR 2025, arXiv 2402.07033): the most popular experts live on the GPU for the whole run; any other expert a layer
needs is either computed on the host CPU, beside its weights in host memory, with only the activations crossing
the link, or copied to the GPU and computed there, whichever the latency model says is faster.

The rule here:

- **Placement** (paper: experts placed on the GPU by popularity from a profiling run, as many as its memory
  holds), ``params.placement``:

  - ``per-layer`` (default): at start, each cached layer's ``hpc_slots + mpc_slots`` hottest experts
    (``cache.hot_profile``, ``PolicyContext.hot_ranking``) fill its slots, pinned for the run (all as HPC), so that
    every policy is compared at equal GPU room per layer;
  - ``global`` (the paper's rule): the most popular experts of the whole model, as many as the GPU room holds
    (``(hpc_slots + mpc_slots) x cached layers``, or ``cache.shared_slots``), however many that gives each layer
    (:func:`global_placement`). A shared cache (``cache.organization: shared``: one budget for the whole model)
    is always placed this way.
- **Run time**, per active expert that is not on the GPU, with ``n`` tokens routed to it: computed on the host
  (source ``cpu``) when ``cpu_expert_s(n) + activation_copy_s(n, "d2h") + activation_copy_s(n, "h2d")`` is below
  ``copy_s(expert_bytes) + expert_s(n)`` (copying its weights and computing on the GPU), else copied now (a miss)
  and dropped after the layer (nothing is kept). The paper's latency model compares the same two paths per expert
  from measured latencies; here they come from the run's cost model (``ctx.costs``). Guess: the
  comparison is per expert, each expert's activations priced alone (the engine moves a layer's host activations
  in one copy each way), ties going to the copy.
- **No prefetch** (Fiddler does not copy ahead): ``plan_prefetch`` returns nothing, whatever the predictor.
"""

from __future__ import annotations

from sim.config.params import one_of
from sim.core.cache import CPU, HPC, MISS
from sim.policies.base import POLICIES, LayerPlan, PinnedOnly, Policy, PolicyContext, selection_counts

PLACEMENTS = ("per-layer", "global")


def global_placement(ctx: PolicyContext, budget: int) -> dict[int, list[int]]:
    """The ``budget`` most popular (layer, expert) pairs of the cached layers, as layer -> experts (hottest first).

    Popularity: each layer's experts in ``ctx.hot_ranking`` order (the hot profile), the k-th hottest of a layer
    weighted by the k-th largest selection count of that layer in the run's trace (``ctx.trace``: with the
    default ``cache.hot_profile: trace`` exactly each expert's own count); without a trace, by rank alone. Ties go
    to the lower rank, then the lower layer."""
    layers = sorted(ctx.cached_layers)
    trace = ctx.trace
    n = ctx.num_experts
    if trace is not None:
        counts = selection_counts(trace.experts, n)
        weight = {layer: sorted((int(c) for c in counts[layer]), reverse=True) for layer in layers}
    else:
        weight = {layer: list(range(n, 0, -1)) for layer in layers}
    pairs = sorted((-weight[layer][k], k, layer) for layer in layers for k in range(n))
    out: dict[int, list[int]] = {layer: [] for layer in layers}
    for _, k, layer in pairs[: max(budget, 0)]:
        out[layer].append(ctx.hot_ranking[layer][k])
    return out


class Placed(PinnedOnly):
    """A pinned-only policy whose GPU experts are placed per layer (the hottest of each layer, ``hpc_slots +
    mpc_slots`` of them) or globally (:func:`global_placement`), or by a subclass's :meth:`placement`. A shared
    cache is one budget for the whole model, placed globally."""

    supports_shared = True

    def is_global(self, ctx: PolicyContext) -> bool:
        return self.params.get("placement") == "global" or ctx.organization == "shared"

    def hpc_capacity(self, ctx: PolicyContext) -> int:
        if self.is_global(ctx):
            return ctx.num_experts  # a layer may hold any number of the model's budget
        return ctx.hpc_slots + ctx.mpc_slots

    def placement(self) -> dict[int, list[int]] | None:
        """Layer -> the experts pinned on the GPU (None: the hottest per layer)."""
        if self.is_global(self.ctx):
            return global_placement(self.ctx, self.ctx.shared_total())
        return None

    def pin_placed(self) -> None:
        placed = self.placement()
        if placed is None:
            self.pin_hot_experts()
            return
        for layer, experts in placed.items():
            self.cache.pin_hpc(layer, experts)


def cost_model(policy: Policy):
    """The run's cost model (``PolicyContext.costs``, which ``sim.decisions.build.build_decisions`` passes)."""
    return policy.ctx.cost_model(policy.name)


@POLICIES.register("fiddler")
class Fiddler(Placed):
    wants_counts = True
    PARAMS = {"placement": "per-layer"}
    PARAM_RULES = {"placement": one_of(*PLACEMENTS)}

    def configure(self) -> None:
        self.costs = cost_model(self)
        self.pin_placed()
        self.copy_s = self.costs.copy_s(self.costs.expert_bytes)
        self._on_cpu: dict[int, bool] = {}

    def on_cpu(self, tokens: int) -> bool:
        """Fiddler's choice for an expert with ``tokens`` tokens: the host when it is faster than a copy."""
        try:
            return self._on_cpu[tokens]
        except KeyError:
            c = self.costs
            host = c.cpu_expert_s(tokens) + c.activation_copy_s(tokens, "d2h") + c.activation_copy_s(tokens, "h2d")
            value = self._on_cpu[tokens] = host < self.copy_s + c.expert_s(tokens)
            return value

    def plan_prefetch(self, iteration, layer, predicted):
        return []

    def plan_layer(self, iteration: int, layer: int, active) -> LayerPlan:
        cache, counts = self.cache, self.layer_counts
        assert counts is not None  # wants_counts: the protocol sets them before plan_layer
        hpc = cache.hpc[layer]
        sources, resident, copied, cpu = {}, [], [], []
        for e in active:
            if e in hpc:
                sources[e] = HPC
                resident.append(e)
            elif self.on_cpu(counts[e]):
                sources[e] = CPU
                cpu.append(e)
            else:
                cache.add_lpc(layer, e)
                sources[e] = MISS
                copied.append((e, MISS))
        return LayerPlan(sources, {}, [], resident, copied, cpu)
