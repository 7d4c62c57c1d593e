"""`oracle`: the next layer's true active set (what Pre-gated MoE's pre-gate gives when it is exact)."""

from sim.predictors.base import PREDICTORS, Predictor


@PREDICTORS.register("oracle")
class OraclePredictor(Predictor):
    def predict(self, iteration, layer, truth, current):
        return frozenset(truth)
