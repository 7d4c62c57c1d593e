"""The least time the cost model allows a run, whatever its policy decides: a bound that holds by construction of
the engine (``sim/timing/engine.py``), for policies that compute experts on the host CPU as for the rest.

In the engine each MoE layer of an iteration takes, on the compute stream, its dense work (``CostModel.dense_s``,
never shortened: slowdowns are >= 1), then its experts: each one the GPU computes takes at least ``expert_s`` of
its tokens (hit and promotion copies, issue floors and slowdowns only add), and the host computes its experts one
after another, each taking at least ``cpu_expert_s`` of its tokens (activation copies and a per-layer call only
add), beside the GPU; the layer ends when both are done. Copies, stalls, round trips and issue costs only add. So a
layer takes at least its dense work plus the least time in which the GPU and the host, running in parallel, can
share its experts' work, each expert split between them in any proportion (:func:`split_s`: the fractional
relaxation, below every assignment a policy can make); and an iteration at least the sum over its layers plus its
LM head. A run takes at least the sum over its iterations (idle time waiting for arrivals only adds).

:class:`BoundedSimulation` is the engine's :class:`~sim.timing.engine.Simulation` that adds up that bound over the
iterations it runs (``bound_s``), whether they are a list or made as requests arrive; ``sim.run.simulate(cfg,
bound=True)`` records it in the summary as ``throughput_bound_tok_s`` (the run's tokens over it).
"""

from __future__ import annotations

from typing import Any

from sim.core.workload import Iteration, active_sets, phase_layers
from sim.costs.costs import CostModel, Memo
from sim.timing.engine import Simulation
from traces.format import Trace

__all__ = ["BoundedSimulation", "IterationBound", "split_s"]


def split_s(gpu: list[float], host: list[float]) -> float:
    """The least time in which a GPU and a host, in parallel, finish experts taking ``gpu[i]`` seconds on the
    GPU or ``host[i]`` on the host, each split between them in any proportion: min over x in [0, 1]^n of
    max(sum x_i gpu_i, sum (1 - x_i) host_i). Optimal: the experts the GPU does relatively fastest (lowest
    gpu/host) go to it until its time meets the host's, the expert at the crossing split."""
    order = sorted(range(len(gpu)), key=lambda i: gpu[i] / host[i] if host[i] > 0 else float("inf"))
    g, h = 0.0, float(sum(host))  # the GPU's time with the experts so far; the host's with the rest
    for i in order:
        gi, hi = gpu[i], host[i]
        if g + gi <= h - hi:
            g, h = g + gi, h - hi
            continue
        if gi + hi <= 0:
            continue
        return g + gi * (h - g) / (gi + hi)  # g + x * gi = h - x * hi, with 0 <= x < 1 since g <= h
    return g


class IterationBound:
    """The bound of one iteration at a time (:meth:`seconds`) over ``trace`` with the engine's ``costs``."""

    def __init__(self, trace: Trace, costs: CostModel):
        self.trace, self.costs = trace, costs
        self.layers = phase_layers(trace)
        self.roles = [x.role for x in trace.meta.model.layers]
        self.gpu = Memo(costs.expert_s)
        self.host = Memo(costs.cpu_expert_s)
        self.lm_head = Memo(costs.lm_head_s)
        self.splits: dict[tuple[int, ...], float] = {}  # tokens per active expert, sorted -> their split

    def split(self, counts: dict[int, int]) -> float:
        """:func:`split_s` of a layer's experts with ``counts`` tokens each (it depends only on those counts)."""
        key = tuple(sorted(counts.values()))
        value = self.splits.get(key)
        if value is None:
            gpu, host = self.gpu, self.host
            value = self.splits[key] = split_s([gpu[n] for n in key], [host[n] for n in key])
        return value

    def seconds(self, it: Iteration) -> float:
        """The least time of ``it``: per layer of its phase, its dense work and its experts split ideally between
        the GPU and the host; then its LM head (over the tokens the engine's runs over)."""
        costs, split, roles = self.costs, self.split, self.roles
        layers = self.layers[it.kind]
        n_tok = int(it.rows.size)
        total = 0.0
        for layer, (_, counts) in zip(layers, active_sets(self.trace, it.rows, layers)):
            total += costs.dense_s(roles[layer], n_tok, it.context) + split(counts)
        return total + self.lm_head[it.lm_head_tokens]


class BoundedSimulation(Simulation):
    """The engine's run, adding up the bound of each iteration it runs (``bound_s``); its results are the plain
    :class:`Simulation`'s."""

    bound_s = 0.0
    _bound: IterationBound | None = None

    def iteration(self, it: Iteration, *args: Any, **kwargs: Any) -> Any:
        if self._bound is None:
            self._bound = IterationBound(self.trace, self.costs)
        self.bound_s += self._bound.seconds(it)
        return super().iteration(it, *args, **kwargs)
