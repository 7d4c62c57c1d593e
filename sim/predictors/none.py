"""`none`: no prediction, so no prefetch."""

from sim.predictors.base import PREDICTORS, Predictor


@PREDICTORS.register("none")
class NoPredictor(Predictor):
    predicts = False

    def predict(self, iteration, layer, truth, current):
        return frozenset()
