"""Cache policies, one module each, registered by name in ``POLICIES`` (the protocol is in ``base.py``).
Every module here is imported, so a new policy is one new module."""

from moebase.registry import import_submodules
from sim.policies.base import POLICIES, LayerPlan, Policy, PolicyContext

import_submodules(__name__, __path__)


def is_ceiling(name: str) -> bool:
    """Whether the policy ``name`` keeps every expert resident (``all_resident``, e.g. gpu-only): its run is the
    ceiling, which needs no tier sizes; its GPU-memory check counts every expert (a model whose experts do not fit
    has no ceiling run)."""
    return isinstance(name, str) and name in POLICIES and bool(POLICIES.get(name).all_resident)


__all__ = ["POLICIES", "LayerPlan", "Policy", "PolicyContext", "is_ceiling"]
