"""Cache policies, one module each, registered by name in ``POLICIES`` (the protocol is in ``base.py``).
Every module here is imported, so a new policy is one new module."""

from sim.policies.base import POLICIES, LayerPlan, Policy, PolicyContext
from sim.registry import import_submodules

import_submodules(__name__, __path__)

__all__ = ["POLICIES", "LayerPlan", "Policy", "PolicyContext"]
