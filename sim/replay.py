"""The decision protocol without time: the calls an engine makes to a policy and a predictor, in the engine's
order, recording every decision. Tests use it to check policies against plain re-statements of their rules, and
to check that an engine (simulator or validator) made exactly these decisions."""

from __future__ import annotations

from dataclasses import dataclass

from sim.policies.base import Policy
from sim.predictors.base import Predictor
from sim.workload import Iteration, active_sets, phase_layers
from traces.format import Trace


@dataclass(frozen=True)
class LayerDecision:
    iteration: int
    layer: int
    active: tuple[int, ...]
    sources: tuple[tuple[int, str], ...]        # (expert, tier or "miss") in active order
    promote: tuple[tuple[int, int | None], ...]  # (expert, victim)
    prefetched: tuple[int, ...]                  # experts of the NEXT layer copied ahead at this gate
    unused_prefetch: tuple[int, ...]


def replay(trace: Trace, iterations: list[Iteration], policy: Policy, predictor: Predictor,
           after_step=None) -> list[LayerDecision]:
    """Drive ``policy`` and ``predictor`` through ``iterations``; ``after_step(policy)`` runs after each layer."""
    layers_of = phase_layers(trace)
    out = []
    for it in iterations:
        if it.new_batch:
            policy.start_batch()
        policy.start_iteration(it)
        predictor.start_iteration(it)
        layers = layers_of[it.kind]
        actives = active_sets(trace, it.rows, layers)
        for pos, layer in enumerate(layers):
            active = actives[pos][0]
            prefetched = ()
            if pos + 1 < len(layers):
                nxt = layers[pos + 1]
                guess = frozenset()
                if predictor.predicts:
                    guess = predictor.predict(it.index, nxt, frozenset(actives[pos + 1][0]), frozenset(active))
                prefetched = tuple(policy.plan_prefetch(it.index, nxt, guess))
            plan = policy.plan_layer(it.index, layer, active)
            out.append(LayerDecision(it.index, layer, active, tuple((e, plan.sources[e]) for e in active),
                                     tuple(plan.promote.items()), prefetched, tuple(plan.unused_prefetch)))
            policy.finish_layer(it.index, layer)
            if after_step is not None:
                after_step(policy)
    return out
