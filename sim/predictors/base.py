"""What a predictor is: given what is known at the gate of MoE layer l, guess layer l+1's active set, so that a
policy can prefetch it during layer l. Engines measure every prediction's precision and recall.

``predict(iteration, layer, truth, current)``: ``layer`` is the layer predicted, ``current`` the active set of
the layer whose gate just ran, ``truth`` the real active set of ``layer`` (given so that oracle-style
predictors can be modelled; a realistic predictor must not read it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moebase.errors import ConfigError
from sim.config.params import Parametrised
from sim.config.registries import PREDICTORS as PREDICTORS  # the registry every predictor registers in
from traces.format import Trace


@dataclass(frozen=True)
class PredictorContext:
    """What a predictor is set up with (``sim.decisions.build.build_decisions`` fills every field)."""

    #: MoE layers and experts per layer of the evaluated model
    num_layers: int
    num_experts: int
    #: the run's seed (a predictor's ``rng`` draws from it)
    seed: int = 0
    #: the evaluated trace, which a realistic predictor reads a layer of only once that layer's gate has run
    trace: Trace | None = None
    #: the evaluated trace's file (a predictor trained on another trace refuses this very file); None when unknown
    trace_path: str | Path | None = None

    def workload_trace(self, who: str) -> Trace:
        """The evaluated trace for a predictor that reads the routing (``who`` names it); a ConfigError without it."""
        if self.trace is None:
            raise ConfigError(
                "predictor.name",
                f"{who}: needs the workload's trace (PredictorContext.trace; "
                "sim.decisions.build.build_decisions passes it)",
            )
        return self.trace


class Predictor(Parametrised):
    name = "base"
    WHERE = "predictor.params"
    #: False for "no prediction at all" (the engine then skips prefetch planning and reports no precision).
    predicts = True

    def __init__(self, params: dict | None, ctx: PredictorContext, where: str = "predictor.params"):
        self.params = self.check_params(params, where)
        self.ctx = ctx
        self.rng = np.random.default_rng(ctx.seed)
        self.configure()

    def configure(self) -> None:
        """Read params. Called once at construction."""

    def start_iteration(self, iteration) -> None:
        """An iteration (``sim.core.workload.Iteration``) is about to run; ``ctx.trace`` holds the routing of
        its rows, of which a realistic predictor may read a layer only once that layer's gate has run."""

    def predict(self, iteration: int, layer: int, truth: frozenset[int], current: frozenset[int]) -> frozenset[int]:
        raise NotImplementedError


class PredictionScore:
    """Running precision/recall of a predictor, overall and per predicted layer: per layer the experts guessed
    right (``tp``), guessed (``predicted``) and active (``actual``), counted in Python ints (one ``add`` per
    layer step) and read as int64 arrays."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self._tp, self._predicted, self._actual = [0] * num_layers, [0] * num_layers, [0] * num_layers

    def add(self, layer: int, predicted: frozenset[int], truth: frozenset[int]) -> None:
        if predicted:
            self._tp[layer] += len(predicted & truth)
            self._predicted[layer] += len(predicted)
        self._actual[layer] += len(truth)

    @property
    def tp(self) -> np.ndarray:
        return np.array(self._tp, dtype=np.int64)

    @property
    def predicted(self) -> np.ndarray:
        return np.array(self._predicted, dtype=np.int64)

    @property
    def actual(self) -> np.ndarray:
        return np.array(self._actual, dtype=np.int64)

    @staticmethod
    def _ratio(a, b):
        return float(a / b) if b else None

    def precision(self) -> float | None:
        return self._ratio(self.tp.sum(), self.predicted.sum())

    def recall(self) -> float | None:
        return self._ratio(self.tp.sum(), self.actual.sum())

    def per_layer(self) -> list[dict]:
        tp, predicted, actual = self.tp, self.predicted, self.actual
        return [
            {
                "layer": i,
                "precision": self._ratio(tp[i], predicted[i]),
                "recall": self._ratio(tp[i], actual[i]),
            }
            for i in range(self.num_layers)
            if actual[i] or predicted[i]
        ]
