"""The decision protocol without time (``sim.decisions.protocol``): every decision of a run, recorded. Tests use it
to check policies against plain re-statements of their rules."""

from __future__ import annotations

from sim.core.workload import Iteration
from sim.decisions.protocol import DecisionProtocol, LayerDecision
from sim.policies.base import Policy
from sim.predictors.base import Predictor
from traces.format import Trace

__all__ = ["LayerDecision", "replay"]


def replay(
    trace: Trace, iterations: list[Iteration], policy: Policy, predictor: Predictor, after_step=None
) -> list[LayerDecision]:
    """Drive ``policy`` and ``predictor`` through ``iterations``; ``after_step(policy)`` runs after each layer."""
    protocol = DecisionProtocol(trace, policy, predictor, record=True, after_step=after_step)
    protocol.run(iterations)
    assert protocol.decisions is not None  # record=True keeps them
    return protocol.decisions
