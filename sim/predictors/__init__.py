"""Next-layer predictors, one module each, registered by name in ``PREDICTORS`` (see ``base.py``)."""

from sim.predictors.base import PREDICTORS, PredictionScore, Predictor, PredictorContext  # noqa: F401
from sim.predictors import noisy, none, oracle  # noqa: F401,E402  (registers them)
