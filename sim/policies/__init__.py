"""Cache policies, one module each, registered by name in ``POLICIES`` (see ``base.py`` for the protocol)."""

from sim.policies.base import POLICIES, LayerPlan, Policy, PolicyContext  # noqa: F401
from sim.policies import diffmoe, gpu_only, lru, on_demand  # noqa: F401,E402  (registers them)
