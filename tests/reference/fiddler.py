"""Fiddler's placement rule restated plainly: the hottest experts on the GPU, any other active expert on the host
when computing it there beats copying it."""

from __future__ import annotations

from sim.core.cache import CPU, HPC, MISS


def fiddler_restated(trace, its, costs, hot, slots):
    """Fiddler's rule, plainly: the ``slots`` hottest experts per layer on the GPU; any other active expert on the
    host when host compute + activations both ways beat a copy + GPU compute."""
    from sim.core.workload import active_sets, phase_layers

    layers_of = phase_layers(trace)
    out = []
    for it in its:
        layers = layers_of[it.kind]
        for layer, (active, counts) in zip(layers, active_sets(trace, it.rows, layers)):
            row = []
            for e in active:
                n = counts[e]
                if e in hot[layer][:slots]:
                    row.append((e, HPC))
                elif costs.cpu_expert_s(n) + costs.activation_copy_s(n, "d2h") + costs.activation_copy_s(
                    n, "h2d"
                ) < costs.copy_s(costs.expert_bytes) + costs.expert_s(n):
                    row.append((e, CPU))
                else:
                    row.append((e, MISS))
            out.append(tuple(row))
    return out
