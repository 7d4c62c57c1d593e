"""`fiddler` (Kamahori et al., "Fiddler: CPU-GPU Orchestration for Fast Inference of Mixture-of-Experts Models",
ICLR 2025, arXiv 2402.07033): the most popular experts live on the GPU for the whole run; any other expert a layer
needs is either computed on the host CPU, beside its weights in host memory, with only the activations crossing
the link, or copied to the GPU and computed there, whichever the latency model says is faster.

The rule here:

- **Placement** (paper: experts placed on the GPU by popularity from a profiling run, as many as its memory
  holds): at start, each cached layer's ``hpc_slots + mpc_slots`` hottest experts (``cache.hot_profile``,
  ``PolicyContext.hot_ranking``) fill its slots, pinned for the run (all as HPC). Guess: the paper fills GPU
  memory by popularity over the whole model; we fill the configured slots per layer, so that every policy is
  compared at equal GPU room per layer.
- **Run time**, per active expert that is not on the GPU, with ``n`` tokens routed to it: computed on the host
  (source ``cpu``) when ``cpu_expert_s(n) + activation_copy_s(n, "d2h") + activation_copy_s(n, "h2d")`` is below
  ``copy_s(expert_bytes) + expert_s(n)`` (copying its weights and computing on the GPU), else copied now (a miss)
  and dropped after the layer (nothing is kept). The paper's latency model compares the same two paths per expert
  from measured latencies; here they come from the run's cost model (``ctx.extra["costs"]``). Guess: the
  comparison is per expert, each expert's activations priced alone (the engine moves a layer's host activations
  in one copy each way), ties going to the copy.
- **No prefetch** (Fiddler does not copy ahead): ``plan_prefetch`` returns nothing, whatever the predictor.
"""

from __future__ import annotations

from sim.cache import CPU, HPC, MISS
from sim.errors import ConfigError
from sim.policies.base import POLICIES, LayerPlan, PinnedOnly, Policy


def cost_model(policy: Policy):
    """The run's cost model (``PolicyContext.extra["costs"]``, which ``sim.decisions.build_decisions`` passes)."""
    costs = policy.ctx.extra.get("costs")
    if costs is None:
        raise ConfigError("policy.name", f"{policy.name}: needs the run's cost model (PolicyContext.extra['costs'])")
    return costs


@POLICIES.register("fiddler")
class Fiddler(PinnedOnly):
    wants_counts = True

    def configure(self) -> None:
        self.costs = cost_model(self)
        self.pin_hot_experts()
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
        counters = cache.counters
        counters.hits[HPC] += len(resident)
        counters.misses += len(copied)
        counters.cpu += len(cpu)
        return LayerPlan(sources, {}, [], resident, copied, cpu)
