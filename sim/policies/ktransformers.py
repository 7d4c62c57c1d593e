"""`ktransformers` (Chen et al., "KTransformers: Unleashing the Full Potential of CPU/GPU Hybrid Inference for MoE
Models", SOSP 2025): the model's dense part (attention, shared experts, the gate) on the GPU, the routed experts on
the host CPU (its AMX kernels), except a static set of hot experts placed on the GPU; no expert weights cross the
link at run time, only the activations of the host experts, each way.

The rule here:

- The dense part is already the engine's GPU work for every policy.
- **Placement**: each cached layer's ``hpc_slots + mpc_slots`` hottest experts (``cache.hot_profile``) are pinned
  on the GPU for the run (all as HPC). Guess: KTransformers places GPU experts by a user's placement rules (and
  its expert-deferral / hot-expert options); the hot profile at equal slots per layer is our stand-in.
- **Run time**: every other active expert is computed on the host (source ``cpu``); nothing is copied, promoted or
  prefetched. Uncached layers compute all their routed experts on the host.
- Not modelled (guess that they matter little here): expert deferral (overlapping a layer's host experts with
  the next layer's GPU work) and CUDA-graph capture of the GPU side.
"""

from __future__ import annotations

from sim.cache import CPU, HPC
from sim.policies.base import POLICIES, LayerPlan, PinnedOnly


@POLICIES.register("ktransformers")
class KTransformers(PinnedOnly):
    def configure(self) -> None:
        self.pin_hot_experts()

    def plan_prefetch(self, iteration, layer, predicted):
        return []

    def plan_layer(self, iteration: int, layer: int, active) -> LayerPlan:
        cache = self.cache
        hpc = cache.hpc[layer]
        sources, resident, cpu = {}, [], []
        for e in active:
            if e in hpc:
                sources[e] = HPC
                resident.append(e)
            else:
                sources[e] = CPU
                cpu.append(e)
        counters = cache.counters
        counters.hits[HPC] += len(resident)
        counters.cpu += len(cpu)
        return LayerPlan(sources, {}, [], resident, [], cpu)
