"""`history`: a layer's active set the last time it ran (the previous iteration of the same phase), empty the
first time a layer runs; never reset (not at batch boundaries either).

The previous iteration has finished when the next one starts, so its routing is known then: it is read from the
trace rows of that iteration at ``start_iteration``. ``truth`` is never read.
"""

from __future__ import annotations

from sim.core.workload import active_sets, phase_layers
from sim.predictors.base import PREDICTORS, Predictor


@PREDICTORS.register("history")
class HistoryPredictor(Predictor):
    def configure(self) -> None:
        self.trace = self.ctx.workload_trace(f"predictor {self.name!r}")
        self.phase_layers = phase_layers(self.trace)
        self.last: dict[int, frozenset[int]] = {}
        self.previous = None

    def start_iteration(self, iteration) -> None:
        prev = self.previous
        if prev is not None:
            layers = self.phase_layers[prev.kind]
            for layer, (active, _) in zip(layers, active_sets(self.trace, prev.rows, layers)):
                self.last[layer] = frozenset(active)
        self.previous = iteration

    def predict(self, iteration, layer, truth, current):
        return self.last.get(layer, frozenset())
