"""The trace-driven SimPy simulator of offloaded MoE inference (see docs/architecture.md).

Importing it imports every policy and predictor, which register themselves by name in
``sim.config.registries``: a run config's names are checked there, without the config code importing the parts."""

import sim.policies
import sim.predictors  # noqa: F401
