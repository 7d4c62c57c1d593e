"""Next-layer predictors, one module each, registered by name in ``PREDICTORS`` (see ``base.py``).
Every module here is imported, so a new predictor is one new module."""

from moebase.registry import import_submodules
from sim.predictors.base import PREDICTORS, PredictionScore, Predictor, PredictorContext

import_submodules(__name__, __path__)

__all__ = ["PREDICTORS", "PredictionScore", "Predictor", "PredictorContext"]
