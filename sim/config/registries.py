"""The registries of the parts a run config names (``policy.name``, ``predictor.name``, ``system.predictor``): the
config checks a name and its params against them without importing the parts. Each part registers itself when its
module is imported; importing the package ``sim`` imports every part (``sim/__init__.py``), so the registries are
full wherever a config is read."""

from __future__ import annotations

from moebase.registry import Registry

#: Every policy, by the name a run config gives (``policy.name``): ``sim/policies/``, one module each.
POLICIES: Registry = Registry("policy")
#: Every predictor, by the name a run config gives (``predictor.name``): ``sim/predictors/``, one module each.
PREDICTORS: Registry = Registry("predictor")
